// The attention twin's kernels (refimpl/backends/cupy_cuda/attention.py, attention_rows_kernel), compiled
// for float and double.
//
// attention_rows: one thread block per query row r = (b * H + h) * Tq + t, ATTENTION_THREADS threads (whole
// warps).
//   1. scores: warp w takes keys s = w, w + n_warps, ...; its 32 lanes split the head dimension and a
//      shuffle sums the partial dot products; lane 0 writes scale * q.k (or -inf where the mask forbids)
//      to the scratch row scores[r, :].
//   2. the row's max m (0 when no key is visible: m - m is not 0 for -inf), e_s = exp(score_s - m) in
//      place, their sum (1 when 0), then p_s = e_s / sum: the reference's softmax, step by step.
//   3. out[r, d] = sum_s p_s v[s, d]: thread j takes the channels d = j, j + blockDim, ... (coalesced).
// attention_split_partials and attention_split_combine: the same for a long row, its keys split over several
// blocks, each writing its part of the softmax, and a second kernel combining the parts.
//
// Query head h reads key/value head g = h / (H / G) (grouped-query attention).  K and V may be views of a
// larger KV-cache buffer: only the [S, D] rows of one (b, g) need be contiguous; b and g step by strides.
// A key s is visible to query t when key_pos[s] <= query_pos[t], with a window (window >= 0; -1 is none)
// also key_pos[s] > query_pos[t] - window, and with padding (has_key_valid) key_valid[b, s] != 0.

template <typename T> __device__ __forceinline__ T negative_infinity();
template <> __device__ __forceinline__ float negative_infinity<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double negative_infinity<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}

template <typename T> __device__ __forceinline__ T warp_sum(T value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

template <typename T> __device__ __forceinline__ T warp_max(T value) {
    for (int offset = 16; offset > 0; offset /= 2) {
        const T other = __shfl_xor_sync(0xffffffffu, value, offset);
        value = other > value ? other : value;
    }
    return value;
}

// The sum (is_max false) or max (is_max true) of one value per thread, returned to every thread.
template <typename T> __device__ T block_reduce(T value, bool is_max) {
    __shared__ T partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    value = is_max ? warp_max(value) : warp_sum(value);
    __syncthreads();                       // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    value = lane < n_warps ? partial[lane] : (is_max ? negative_infinity<T>() : (T)0);
    return is_max ? warp_max(value) : warp_sum(value);
}

// score_row[s] = q . k[s] * scale for the keys s0 <= s < s1 that position p sees (causal, in the window, valid),
// -infinity for the others: one warp per key, its lanes splitting the dot product.
template <typename T>
__device__ void masked_scores(const T* q_row, const T* k_bg, const long long* key_pos, const unsigned char* key_valid,
                              T* score_row, int b, int S, int D, long long p, long long window, int has_key_valid,
                              T scale, int s0, int s1) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int s = s0 + warp; s < s1; s += n_warps) {
        T dot = 0;
        for (int d = lane; d < D; d += 32) dot += q_row[d] * k_bg[(long long)s * D + d];
        dot = warp_sum(dot);
        const long long ks = key_pos[s];
        const bool visible = ks <= p && (window < 0 || ks > p - window)
                             && (!has_key_valid || key_valid[(long long)b * S + s] != 0);
        if (lane == 0) score_row[s] = visible ? dot * scale : negative_infinity<T>();
    }
}

template <typename T>
__global__ void attention_rows(const T* q,                    // [B, H, Tq, D]
                               const T* k,                    // [B, G, S, D], rows of a (b, g) contiguous
                               const T* v,                    // [B, G, S, Dv], the same
                               const long long* query_pos,    // [Tq]
                               const long long* key_pos,      // [S]
                               const unsigned char* key_valid, // [B, S], read only when has_key_valid
                               T* scores,                     // [B, H, Tq, S] scratch
                               T* out,                        // [B, H, Tq, Dv]
                               int H, int G, int Tq, int S, int D, int Dv,
                               long long k_stride_b, long long k_stride_g,   // elements between batches,
                               long long v_stride_b, long long v_stride_g,   // between heads (a KV cache view)
                               long long window, int has_key_valid, T scale) {   // window -1: none
    const long long row = blockIdx.x;                         // (b * H + h) * Tq + t
    const int t = (int)(row % Tq);
    const int h = (int)((row / Tq) % H);
    const int b = (int)(row / ((long long)Tq * H));
    const int g = h / (H / G);
    const T* q_row = q + row * D;
    const T* k_bg = k + b * k_stride_b + g * k_stride_g;
    const T* v_bg = v + b * v_stride_b + g * v_stride_g;
    T* score_row = scores + row * S;
    const long long p = query_pos[t];
    masked_scores(q_row, k_bg, key_pos, key_valid, score_row, b, S, D, p, window, has_key_valid, scale, 0, S);
    __syncthreads();

    T m = negative_infinity<T>();
    for (int s = threadIdx.x; s < S; s += blockDim.x) m = score_row[s] > m ? score_row[s] : m;
    m = block_reduce(m, true);
    if (!(m - m == (T)0)) m = 0;                              // not finite (no visible key): 0
    T sum = 0;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const T e = exp(score_row[s] - m);
        score_row[s] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    if (sum == (T)0) sum = 1;
    for (int s = threadIdx.x; s < S; s += blockDim.x) score_row[s] = score_row[s] / sum;
    __syncthreads();

    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int s = 0; s < S; ++s) acc += score_row[s] * v_bg[(long long)s * Dv + d];
        out[row * Dv + d] = acc;
    }
}

// The keys of a row split over gridDim.y blocks: block (row, j) takes keys s0 = j * span <= s < s1 and
// writes its part of the softmax: m_j (the max of its visible scores, 0 when none), l_j = sum exp(score - m_j)
// and acc_j[d] = sum exp(score - m_j) v[s, d] (unnormalised).  attention_split_combine then forms the row.
template <typename T>
__global__ void attention_split_partials(const T* q, const T* k, const T* v, const long long* query_pos,
                                         const long long* key_pos, const unsigned char* key_valid,
                                         T* scores,                    // [B, H, Tq, S] scratch
                                         T* part_max, T* part_sum,     // [B, H, Tq, n_splits]
                                         T* part_out,                  // [B, H, Tq, n_splits, Dv]
                                         int H, int G, int Tq, int S, int D, int Dv,
                                         long long k_stride_b, long long k_stride_g,
                                         long long v_stride_b, long long v_stride_g,
                                         long long window, int has_key_valid, T scale, int span) {
    const long long row = blockIdx.x;                         // (b * H + h) * Tq + t
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int s0 = split * span, s1 = min(S, s0 + span);
    const int t = (int)(row % Tq);
    const int h = (int)((row / Tq) % H);
    const int b = (int)(row / ((long long)Tq * H));
    const int g = h / (H / G);
    const T* q_row = q + row * D;
    const T* k_bg = k + b * k_stride_b + g * k_stride_g;
    const T* v_bg = v + b * v_stride_b + g * v_stride_g;
    T* score_row = scores + row * S;
    const long long p = query_pos[t];
    masked_scores(q_row, k_bg, key_pos, key_valid, score_row, b, S, D, p, window, has_key_valid, scale, s0, s1);
    __syncthreads();

    T m = negative_infinity<T>();
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) m = score_row[s] > m ? score_row[s] : m;
    m = block_reduce(m, true);
    if (!(m - m == (T)0)) m = 0;                              // no visible key in this part: l_j = 0
    T sum = 0;
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
        const T e = exp(score_row[s] - m);
        score_row[s] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    __syncthreads();

    const long long part = row * n_splits + split;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int s = s0; s < s1; ++s) acc += score_row[s] * v_bg[(long long)s * Dv + d];
        part_out[part * Dv + d] = acc;
    }
    if (threadIdx.x == 0) {
        part_max[part] = m;
        part_sum[part] = sum;
    }
}

// One block per row: M = the largest m_j of the parts with a visible key (0 when none), w_j = exp(m_j - M),
// out[d] = sum_j w_j acc_j[d] / sum_j w_j l_j (a sum of 0 taken as 1: a row that sees no key gives zeros).
template <typename T>
__global__ void attention_split_combine(const T* part_max, const T* part_sum, const T* part_out, T* out,
                                        int n_splits, int Dv) {
    const long long row = blockIdx.x;
    const T* m_row = part_max + row * n_splits;
    const T* l_row = part_sum + row * n_splits;
    T M = negative_infinity<T>();
    for (int j = 0; j < n_splits; ++j) M = (l_row[j] > (T)0 && m_row[j] > M) ? m_row[j] : M;
    if (!(M - M == (T)0)) M = 0;
    T total = 0;
    for (int j = 0; j < n_splits; ++j) total += l_row[j] > (T)0 ? exp(m_row[j] - M) * l_row[j] : (T)0;
    if (total == (T)0) total = 1;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        T acc = 0;
        for (int j = 0; j < n_splits; ++j) {
            if (l_row[j] > (T)0) acc += exp(m_row[j] - M) * part_out[(row * n_splits + j) * Dv + d];
        }
        out[row * Dv + d] = acc / total;
    }
}
