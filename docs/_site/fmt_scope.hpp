// For Doxygen only (docs/_site/Doxyfile): the scopes of the standard
// library's and fmt's templates that public headers may specialize with a
// qualified name (`struct fmt::formatter<T>`, `struct std::hash<T>`), which
// Doxygen cannot resolve without those libraries' headers. Not part of the SDK.
namespace fmt {
template <class T, class Char>
struct formatter;
}
namespace std {
template <class T>
struct hash;
}
