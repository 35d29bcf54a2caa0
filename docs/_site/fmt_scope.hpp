// For Doxygen only (docs/_site/Doxyfile): the scope of the fmt::formatter
// specializations that public headers define, which Doxygen cannot resolve
// without fmt's own headers. Not part of the SDK.
namespace fmt {
template <class T, class Char>
struct formatter;
}
