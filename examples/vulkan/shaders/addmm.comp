// vkdev's matrix product (vkdev_kernels.cpp): out = beta * bias + alpha * (a @ b),
// float32, a (m, k) and b (k, n) of any element strides, the bias broadcast to
// (m, n) by its strides (0 where broadcast), out contiguous (m, n). 16x16
// tiles through shared memory; one invocation per output element.
#version 450

#define TILE 16
layout(local_size_x = TILE, local_size_y = TILE) in;

layout(std430, set = 0, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { float c[]; };

layout(push_constant) uniform Params {
  uint m, n, k;
  uint has_bias;
  uint sa0, sa1, sb0, sb1, sc0, sc1;
  uint off_o, off_a, off_b, off_c;
  float alpha, beta;
} p;

shared float ta[TILE][TILE];
shared float tb[TILE][TILE];

void main() {
  uint li = gl_LocalInvocationID.y, lj = gl_LocalInvocationID.x;
  uint i = gl_WorkGroupID.y * TILE + li;
  uint j = gl_WorkGroupID.x * TILE + lj;
  float acc = 0.0;
  for (uint k0 = 0; k0 < p.k; k0 += TILE) {
    ta[li][lj] = (i < p.m && k0 + lj < p.k) ? a[p.off_a + i * p.sa0 + (k0 + lj) * p.sa1] : 0.0;
    tb[li][lj] = (k0 + li < p.k && j < p.n) ? b[p.off_b + (k0 + li) * p.sb0 + j * p.sb1] : 0.0;
    barrier();
    for (uint q = 0; q < TILE; ++q) acc += ta[li][q] * tb[q][lj];
    barrier();
  }
  if (i < p.m && j < p.n) {
    float r = p.alpha == 1.0 ? acc : p.alpha * acc;
    if (p.has_bias != 0u) {
      float v = c[p.off_c + i * p.sc0 + j * p.sc1];
      r += p.beta == 1.0 ? v : p.beta * v;
    }
    o[p.off_o + i * p.n + j] = r;
  }
}
