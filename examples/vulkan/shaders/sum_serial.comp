// vkdev's sum over dims where there are many sums (vkdev_kernels.cpp),
// float32: one invocation per output element (the kept dims), summing the
// reduced dims in order with Neumaier's compensation, with no shared memory
// and no barrier (sum.comp's work-group per output suits few, long sums).
// Kept and reduced dims at most 4 each after merging; output contiguous.
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Red {
  uint off_o, off_a;  // element offsets in the bindings
  uint nout, nred, nk, nr, pad0, pad1;
  uvec4 ksize, kstride, rsize, rstride;
} g;

void main() {
  uint w0 = gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x + gl_GlobalInvocationID.x;
  if (w0 >= g.nout) return;
  uint base = g.off_a, r = w0;
  for (int d = int(g.nk) - 1; d >= 0; --d) {
    base += (r % g.ksize[d]) * g.kstride[d];
    r /= g.ksize[d];
  }
  float s = 0.0, c = 0.0;
  if (g.nr == 1u) {  // one reduced dim: no division
    for (uint e = 0u; e < g.nred; ++e) {
      float x = a[base + e * g.rstride[0]], t = s + x;
      c += abs(s) >= abs(x) ? (s - t) + x : (x - t) + s;
      s = t;
    }
  } else {
    for (uint e = 0u; e < g.nred; ++e) {
      uint off = 0u, q = e;
      for (int d = int(g.nr) - 1; d >= 0; --d) {
        off += (q % g.rsize[d]) * g.rstride[d];
        q /= g.rsize[d];
      }
      float x = a[base + off], t = s + x;
      c += abs(s) >= abs(x) ? (s - t) + x : (x - t) + s;
      s = t;
    }
  }
  o[g.off_o + w0] = isinf(s) || isnan(s) ? s : s + c;
}
