// The norm and the rotation of a transformer layer, one launch each (refimpl/backends/cupy_cuda/transformer.py,
// rms_norm and apply_rope), compiled for float and double.  A generation step on the device is mostly
// launches: as formulas, the norm is six CuPy operations (x * x, the mean, + eps, the root, the division,
// * w) and the rotation five (the negated half, the concatenation, two products and a sum).

template <typename T>
__device__ T rows_warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// One block per row r of x [R, C] (C-contiguous): thread k sums x[r, c]^2 over c = k, k + blockDim.x, ...
// in that order, a warp's lanes are summed by the butterfly, thread 0 adds the warps' sums in order; then
// out[r, c] = w[c] * (x[r, c] / sqrt(sum / C + eps)), the reference's formula.
template <typename T>
__global__ void rms_norm_rows(const T* x, const T* w, T* out, int C, T eps) {
    __shared__ T warp_sums[32];
    __shared__ T root;
    const T* row = x + (long long)blockIdx.x * C;
    T acc = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) acc += row[c] * row[c];
    acc = rows_warp_sum(acc);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        T total = 0;
        for (int k = 0; k < blockDim.x / 32; ++k) total += warp_sums[k];
        root = sqrt(total / (T)C + eps);
    }
    __syncthreads();
    T* out_row = out + (long long)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out_row[c] = w[c] * (row[c] / root);
}

// out = x * cos + rotate_half(x) * sin for x [B, H, T, D] (C-contiguous; i = ((b H + h) T + t) D + j) and
// cos, sin [Bc, T, D] with Bc = 1 or B: rotate_half(x)[j] = -x[j + D/2] for j < D/2, x[j - D/2] after.
template <typename T>
__global__ void rope_rows(const T* x, const T* cos, const T* sin, T* out, long long n, int H, int Tn, int D,
                          int cos_batches) {
    const int half = D / 2;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        const int j = (int)(i % D);
        const long long row = i / D;
        const int t = (int)(row % Tn);
        const long long b = cos_batches == 1 ? 0 : row / ((long long)Tn * H);
        const long long k = (b * Tn + t) * D + j;
        const T rotated = j < half ? -x[i + half] : x[i - half];
        out[i] = x[i] * cos[k] + rotated * sin[k];
    }
}
