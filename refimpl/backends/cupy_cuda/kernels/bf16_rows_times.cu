// The bfloat16 product of the linear twin (refimpl/backends/cupy_cuda/linear.py, bf16_rows_times).
//
// One warp per output channel o (BF16_WARPS warps per block); for each row n of x the 32 lanes split the
// input channels, widen each bfloat16 word to float32 (the word in the upper half of a 32-bit pattern,
// exact), multiply-add, and a shuffle sums the lanes: out[n, o] = sum_i x[n, i] * widen(bits[o, i]).

extern "C" __global__ void bf16_rows_times(const float* x,               // [N, I]
                                           const unsigned short* bits,   // [O, I] bfloat16 words
                                           float* out,                   // [N, O]
                                           int N, int O, int I) {
    const int lane = threadIdx.x % 32;
    const long long o = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (o >= O) return;                                     // the whole warp leaves together
    const unsigned short* row = bits + o * I;
    for (int n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int i = lane; i < I; i += 32) acc += x[(long long)n * I + i] * __uint_as_float((unsigned int)row[i] << 16);
        for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        if (lane == 0) out[(long long)n * O + o] = acc;
    }
}
