// vkdev's sum over dims (vkdev_kernels.cpp), float32: one work-group per
// output element (the kept dims), its 64 invocations summing the reduced
// dims with Neumaier's compensation and combining the (sum, compensation)
// pairs exactly (TwoSum): about as accurate as the CPU's cascade summation.
// Kept and reduced dims at most 4 each after merging; output contiguous.
#version 450

#define RG 64
layout(local_size_x = RG) in;

layout(std430, set = 0, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Red {
  uint off_o, off_a;  // element offsets in the bindings
  uint nout, nred, nk, nr, pad0, pad1;
  uvec4 ksize, kstride, rsize, rstride;
} g;

shared float ps[RG];
shared float pc[RG];

void main() {
  uint w0 = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  uint l = gl_LocalInvocationID.x;
  if (w0 >= g.nout) return;  // the whole work-group: no barrier is skipped by part of it
  uint base = g.off_a, r = w0;
  for (int d = int(g.nk) - 1; d >= 0; --d) {
    base += (r % g.ksize[d]) * g.kstride[d];
    r /= g.ksize[d];
  }
  float s = 0.0, c = 0.0;
  for (uint e = l; e < g.nred; e += RG) {
    uint off = 0u, q = e;
    for (int d = int(g.nr) - 1; d >= 0; --d) {
      off += (q % g.rsize[d]) * g.rstride[d];
      q /= g.rsize[d];
    }
    float x = a[base + off], t = s + x;
    c += abs(s) >= abs(x) ? (s - t) + x : (x - t) + s;
    s = t;
  }
  ps[l] = s;
  pc[l] = c;
  barrier();
  for (uint w = RG / 2; w > 0; w >>= 1) {
    if (l < w) {
      float x = ps[l], y = ps[l + w], t = x + y, v = t - x;
      pc[l] += pc[l + w] + ((x - (t - v)) + (y - v));
      ps[l] = t;
    }
    barrier();
  }
  if (l == 0u) o[g.off_o + w0] = isinf(ps[0]) || isnan(ps[0]) ? ps[0] : ps[0] + pc[0];
}
