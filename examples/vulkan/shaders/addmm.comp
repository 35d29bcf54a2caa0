// vkdev's matrix product (vkdev_kernels.cpp): out = beta * bias + alpha * (a @ b),
// float32, a (m, k) and b (k, n) of any element strides, the bias broadcast to
// (m, n) by its strides (0 where broadcast), out contiguous (m, n). Each
// invocation computes a 4x4 block of the output in registers, with no shared
// memory and no barrier (a barrier suspends every invocation on lavapipe).
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { float c[]; };

layout(push_constant) uniform Params {
  uint off_o, off_a, off_b, off_c;  // element offsets in the bindings
  uint m, n, k;
  uint has_bias;
  uint sa0, sa1, sb0, sb1, sc0, sc1;
  float alpha, beta;
} p;

void main() {
  uint blocks = (p.n + 3) / 4;  // 4-column blocks per row of blocks
  uint t = gl_GlobalInvocationID.x;
  uint i0 = (t / blocks) * 4, j0 = (t % blocks) * 4;
  if (i0 >= p.m) return;
  // Rows and columns past the edge read the last one (and are not written).
  uvec4 ia = p.off_a + min(uvec4(i0) + uvec4(0, 1, 2, 3), uvec4(p.m - 1)) * p.sa0;
  uvec4 ib = p.off_b + min(uvec4(j0) + uvec4(0, 1, 2, 3), uvec4(p.n - 1)) * p.sb1;
  mat4 acc = mat4(0.0);  // acc[column][row]
  for (uint q = 0; q < p.k; ++q) {
    uint qa = q * p.sa1, qb = q * p.sb0;
    vec4 av = vec4(a[ia.x + qa], a[ia.y + qa], a[ia.z + qa], a[ia.w + qa]);
    vec4 bv = vec4(b[ib.x + qb], b[ib.y + qb], b[ib.z + qb], b[ib.w + qb]);
    acc[0] += av * bv.x;
    acc[1] += av * bv.y;
    acc[2] += av * bv.z;
    acc[3] += av * bv.w;
  }
  for (uint u = 0; u < 4 && j0 + u < p.n; ++u) {
    uint j = j0 + u;
    for (uint s = 0; s < 4 && i0 + s < p.m; ++s) {
      uint i = i0 + s;
      float r = p.alpha == 1.0 ? acc[u][s] : p.alpha * acc[u][s];
      if (p.has_bias != 0u) {
        float v = c[p.off_c + i * p.sc0 + j * p.sc1];
        r += p.beta == 1.0 ? v : p.beta * v;
      }
      o[p.off_o + i * p.n + j] = r;
    }
  }
}
