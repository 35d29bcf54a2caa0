// vkdev's sum over dims (vkdev_kernels.cpp), float32, with Neumaier's
// compensation. SERIAL (specialization constant 0), for many sums: an
// invocation per output element (the kept dims) sums the reduced dims in
// order, with no shared memory and no barrier. Otherwise, for few long sums:
// a work-group per output element, whose 64 (sum, compensation) pairs are
// combined exactly (TwoSum), about as accurate as the CPU's cascade summation.
// Kept and reduced dims at most 4 each after merging; output contiguous.
#version 450

#define RG 64
layout(local_size_x = RG) in;
layout(constant_id = 0) const bool SERIAL = false;

layout(std430, set = 0, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };

layout(push_constant) uniform Red {
  uint off_o, off_a;  // element offsets in the bindings
  uint nout, nred, nk, nr, pad0, pad1;
  uvec4 ksize, kstride, rsize, rstride;
} g;

shared float ps[RG];
shared float pc[RG];

uint offset(uint i, uint n, uvec4 size, uvec4 stride) {  // of element i of n dims
  uint off = 0u;
  for (int d = int(n) - 1; d >= 0; --d) {
    off += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return off;
}

void add(inout float s, inout float c, float x) {
  float t = s + x;
  c += abs(s) >= abs(x) ? (s - t) + x : (x - t) + s;
  s = t;
}

void main() {
  uint w0 = SERIAL ? gl_GlobalInvocationID.y * gl_NumWorkGroups.x * RG + gl_GlobalInvocationID.x
                   : gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  uint l = SERIAL ? 0u : gl_LocalInvocationID.x, step = SERIAL ? 1u : RG;
  if (w0 >= g.nout) return;  // not SERIAL: the whole work-group, so no barrier is skipped by part of it
  uint base = g.off_a + offset(w0, g.nk, g.ksize, g.kstride);
  float s = 0.0, c = 0.0;
  if (g.nr == 1u)  // one reduced dim: no division
    for (uint e = l; e < g.nred; e += step) add(s, c, a[base + e * g.rstride[0]]);
  else
    for (uint e = l; e < g.nred; e += step) add(s, c, a[base + offset(e, g.nr, g.rsize, g.rstride)]);
  if (!SERIAL) {
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
    s = ps[0];
    c = pc[0];
  }
  if (l == 0u) o[g.off_o + w0] = isinf(s) || isnan(s) ? s : s + c;
}
