// vkdev's elementwise kernel (vkdev_kernels.cpp): out = f(a, b, s), float32,
// over a broadcast, strided layout of at most 4 merged dims; element offsets
// and strides are push constants (Note [vkdev kernel bindings]).
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { float b[]; };

layout(push_constant) uniform Geom {
  uint off_o, off_a, off_b;  // element offsets in the bindings
  uint n;     // elements
  uint ndim;  // 0..4
  uint op;    // Op in vkdev_kernels.hpp
  float s;    // add's alpha, threshold_backward's threshold, the scalar operand
  uint pad;
  uvec4 size;
  uvec4 so, sa, sb;  // element strides (0 where broadcast)
} g;

float f(float x, uint ib) {
  switch (g.op) {
    case 0u: return g.s == 1.0 ? x + b[ib] : x + g.s * b[ib];  // add
    case 1u: return x * b[ib];                                  // mul
    case 2u: return (x > 0.0 || isnan(x)) ? x : 0.0;            // relu
    case 3u: return b[ib] <= g.s ? 0.0 : x;                     // threshold_backward
    case 4u: return x + g.s;                                    // add a number
    default: return x * g.s;                                    // mul by a number
  }
}

void main() {
  uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < g.n; i += step) {
    uint io = g.off_o, ia = g.off_a, ib = g.off_b, r = i;
    for (int d = int(g.ndim) - 1; d > 0; --d) {  // none for one dim; no division for the first
      uint c = r % g.size[d];
      r /= g.size[d];
      io += c * g.so[d];
      ia += c * g.sa[d];
      ib += c * g.sb[d];
    }
    io += r * g.so[0];
    ia += r * g.sa[0];
    ib += r * g.sb[0];
    o[io] = f(a[ia], ib);
  }
}
