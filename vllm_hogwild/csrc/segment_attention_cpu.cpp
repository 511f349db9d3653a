// Segment attention for single-token (decode) rows over vLLM's CPU paged KV cache.
//
// Cache: [num_blocks, kv_heads, block_size, 2 * head_dim]; per [block, kv_head]
// the K block (transposed [head_dim, block_size] or plain [block_size, head_dim])
// then the V block [block_size, head_dim]. Read in place: no copies.
//
// Every row is one query token reading a list of pairs (one per segment of its
// view); a pair rotates the query by its own cos/sin and attends a list of
// pieces (block, [lo, hi) offsets). One online softmax per (row, query head)
// over all pairs and pieces: the log-sum-exp merge of the segments.
// The query heads sharing a KV head are processed together so each K/V element
// is loaded once for all of them.
//
// Built with -ffast-math so that exp and the dot products vectorize: the code
// therefore never forms an infinity or a NaN (running maxima start at a finite
// floor instead of -inf). Built with OpenMP so that at::parallel_for spreads the
// (row, KV head) jobs over torch's threads.
//
// A float32, bf16 or fp16 cache with K stored transposed (vLLM's AVX2/AVX-512
// "vec" layouts), block size and head_dim multiples of 16 and 1-4 query heads
// per KV head takes a register-tiled AVX2 path
// (piece_avx2): 16 keys' scores, or 16 dims of V, for all query heads of the KV
// head stay in registers while K or V streams through once. It sums in the same
// order as the generic path, so the two give identical results.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOGWILD_AVX2 1
#endif

namespace {

// Finite stand-in for -inf (see the note on -ffast-math above): exp(kFloor - m) is 0.
constexpr float kFloor = -1e30f;

template <typename scalar_t>
inline float to_f(scalar_t x) { return static_cast<float>(x); }


// Running softmax update of G heads over the scores of keys [lo, hi) (already
// scaled); the scores become the unnormalised weights exp(s - m).
template <int G>
inline void softmax_update(float* s, int64_t bs, int64_t lo, int64_t hi, int64_t d,
                           float* acc, float* m, float* l) {
  const int64_t n = hi - lo;
  for (int gi = 0; gi < G; ++gi) {
    float* srow = s + gi * bs + lo;
    float bmax = kFloor;
    for (int64_t j = 0; j < n; ++j) bmax = std::max(bmax, srow[j]);
    const float m_new = std::max(m[gi], bmax);
    const float rescale = std::exp(m[gi] - m_new);
    float* a = acc + gi * d;
    for (int64_t e = 0; e < d; ++e) a[e] *= rescale;
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) srow[j] = std::exp(srow[j] - m_new);  // vectorized
    for (int64_t j = 0; j < n; ++j) sum += srow[j];
    l[gi] = l[gi] * rescale + sum;
    m[gi] = m_new;
  }
}

#ifdef HOGWILD_AVX2
constexpr int64_t kTile = 16;  // two 8-float registers

// 8 cache elements as 8 floats (exact conversions).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bf16 is the high half of a float32
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
#ifdef __F16C__
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

// One piece (keys [lo, hi) of one block) for G query heads of one KV head.
// K block [d, bs] (transposed), V block [bs, d]; bs and d multiples of kTile.
template <int G, typename scalar_t>
void piece_avx2(const float* qr, const scalar_t* kb, const scalar_t* vb, int64_t d, int64_t bs,
                int64_t lo, int64_t hi, float sc, float* s, float* acc, float* m, float* l) {
  // Scores over whole tiles covering [lo, hi): still inside the block, and the
  // keys outside [lo, hi) are never read back.
  const __m256 vsc = _mm256_set1_ps(sc);
  for (int64_t j0 = lo / kTile * kTile; j0 < hi; j0 += kTile) {
    __m256 t0[G], t1[G];
    for (int gi = 0; gi < G; ++gi) t0[gi] = t1[gi] = _mm256_setzero_ps();
    for (int64_t e = 0; e < d; ++e) {
      const scalar_t* kr = kb + e * bs + j0;
      const __m256 k0 = load8(kr), k1 = load8(kr + 8);
      for (int gi = 0; gi < G; ++gi) {
        const __m256 y = _mm256_broadcast_ss(qr + gi * d + e);
        t0[gi] = _mm256_fmadd_ps(y, k0, t0[gi]);
        t1[gi] = _mm256_fmadd_ps(y, k1, t1[gi]);
      }
    }
    for (int gi = 0; gi < G; ++gi) {
      _mm256_storeu_ps(s + gi * bs + j0, _mm256_mul_ps(t0[gi], vsc));
      _mm256_storeu_ps(s + gi * bs + j0 + 8, _mm256_mul_ps(t1[gi], vsc));
    }
  }
  softmax_update<G>(s, bs, lo, hi, d, acc, m, l);
  // V: 16 dims of every head's accumulator stay in registers over all keys.
  for (int64_t e0 = 0; e0 < d; e0 += kTile) {
    __m256 t0[G], t1[G];
    for (int gi = 0; gi < G; ++gi) {
      t0[gi] = _mm256_loadu_ps(acc + gi * d + e0);
      t1[gi] = _mm256_loadu_ps(acc + gi * d + e0 + 8);
    }
    for (int64_t j = lo; j < hi; ++j) {
      const scalar_t* v = vb + j * d + e0;
      const __m256 v0 = load8(v), v1 = load8(v + 8);
      for (int gi = 0; gi < G; ++gi) {
        const __m256 w = _mm256_broadcast_ss(s + gi * bs + j);
        t0[gi] = _mm256_fmadd_ps(w, v0, t0[gi]);
        t1[gi] = _mm256_fmadd_ps(w, v1, t1[gi]);
      }
    }
    for (int gi = 0; gi < G; ++gi) {
      _mm256_storeu_ps(acc + gi * d + e0, t0[gi]);
      _mm256_storeu_ps(acc + gi * d + e0 + 8, t1[gi]);
    }
  }
}

// The tiled path for g query heads per KV head; false when g has no instance.
template <typename scalar_t>
inline bool piece_tiled(int64_t g, const float* qr, const scalar_t* kb, const scalar_t* vb, int64_t d,
                        int64_t bs, int64_t lo, int64_t hi, float sc, float* s, float* acc, float* m,
                        float* l) {
#ifndef __F16C__
  if constexpr (std::is_same<scalar_t, c10::Half>::value) {
    return false;
  } else
#endif
  if constexpr (std::is_same<scalar_t, double>::value) {
    return false;
  } else {
    switch (g) {
      case 1: piece_avx2<1>(qr, kb, vb, d, bs, lo, hi, sc, s, acc, m, l); return true;
      case 2: piece_avx2<2>(qr, kb, vb, d, bs, lo, hi, sc, s, acc, m, l); return true;
      case 3: piece_avx2<3>(qr, kb, vb, d, bs, lo, hi, sc, s, acc, m, l); return true;
      case 4: piece_avx2<4>(qr, kb, vb, d, bs, lo, hi, sc, s, acc, m, l); return true;
      default: return false;
    }
  }
}
#else
template <typename scalar_t>
inline bool piece_tiled(int64_t, const float*, const scalar_t*, const scalar_t*, int64_t, int64_t, int64_t,
                        int64_t, float, float*, float*, float*, float*) {
  return false;
}
constexpr int64_t kTile = 16;
#endif

template <typename scalar_t>
void run_rows(const torch::Tensor& query, const torch::Tensor& cache, bool k_transposed,
              const torch::Tensor& row_token, const torch::Tensor& row_pair_ptr,
              const torch::Tensor& pair_cos, const torch::Tensor& pair_sin,
              const torch::Tensor& pair_piece_ptr, const torch::Tensor& piece_block,
              const torch::Tensor& piece_lo, const torch::Tensor& piece_hi,
              int64_t rotary_dim, bool neox, double scale, torch::Tensor& out) {
  const int64_t num_rows = row_token.size(0);
  const int64_t hq = query.size(1), d = query.size(2);
  const int64_t heads = cache.size(1), bs = cache.size(2);
  const int64_t g = hq / heads;
  const int64_t half = rotary_dim / 2;
  const float* q = query.data_ptr<float>();
  const scalar_t* kv = cache.data_ptr<scalar_t>();
  float* o = out.data_ptr<float>();
  const int64_t* rt = row_token.data_ptr<int64_t>();
  const int64_t* rp = row_pair_ptr.data_ptr<int64_t>();
  const float* pc = pair_cos.data_ptr<float>();
  const float* ps = pair_sin.data_ptr<float>();
  const int64_t* pp = pair_piece_ptr.data_ptr<int64_t>();
  const int64_t* pb = piece_block.data_ptr<int64_t>();
  const int64_t* plo = piece_lo.data_ptr<int64_t>();
  const int64_t* phi = piece_hi.data_ptr<int64_t>();
  const float sc = static_cast<float>(scale);
  const int64_t block_stride = heads * bs * 2 * d, head_stride = bs * 2 * d;
  const bool tiled = k_transposed && bs % kTile == 0 && d % kTile == 0;

  at::parallel_for(0, num_rows * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qr(g * d), acc(g * d), m(g), l(g), s(g * bs);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t r = job / heads, h = job % heads;
      const int64_t tok = rt[r];
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kFloor);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
        const float* c = pc + p * half;
        const float* sn = ps + p * half;
        for (int64_t gi = 0; gi < g; ++gi) {  // rotate the query for this pair
          const float* x = q + (tok * hq + h * g + gi) * d;
          float* y = qr.data() + gi * d;
          for (int64_t i = 0; i < d; ++i) y[i] = x[i];
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            y[a] = x[a] * c[i] - x[b] * sn[i];
            y[b] = x[b] * c[i] + x[a] * sn[i];
          }
        }
        for (int64_t pi = pp[p]; pi < pp[p + 1]; ++pi) {
          const int64_t lo = plo[pi], hi = phi[pi], n = hi - lo;
          const scalar_t* kb = kv + pb[pi] * block_stride + h * head_stride;
          const scalar_t* vb = kb + bs * d;
          if (tiled && piece_tiled<scalar_t>(g, qr.data(), kb, vb, d, bs, lo, hi, sc, s.data(), acc.data(),
                                             m.data(), l.data())) {
            continue;
          }
          // Scores of every query head of this KV head against keys lo..hi.
          for (int64_t gi = 0; gi < g; ++gi) {
            float* srow = s.data() + gi * bs;
            const float* y = qr.data() + gi * d;
            for (int64_t j = 0; j < n; ++j) srow[j] = 0.f;
            if (k_transposed) {
              for (int64_t e = 0; e < d; ++e) {
                const scalar_t* krow = kb + e * bs + lo;
                const float ye = y[e];
                for (int64_t j = 0; j < n; ++j) srow[j] += ye * to_f(krow[j]);
              }
            } else {
              for (int64_t j = 0; j < n; ++j) {
                const scalar_t* k = kb + (lo + j) * d;
                float dot = 0.f;
                for (int64_t e = 0; e < d; ++e) dot += y[e] * to_f(k[e]);
                srow[j] = dot;
              }
            }
          }
          for (int64_t gi = 0; gi < g; ++gi) {
            float* srow = s.data() + gi * bs;
            float bmax = kFloor;
            for (int64_t j = 0; j < n; ++j) {
              srow[j] *= sc;
              bmax = std::max(bmax, srow[j]);
            }
            const float m_new = std::max(m[gi], bmax);
            const float rescale = std::exp(m[gi] - m_new);
            float* a = acc.data() + gi * d;
            for (int64_t e = 0; e < d; ++e) a[e] *= rescale;
            float sum = 0.f;
            for (int64_t j = 0; j < n; ++j) srow[j] = std::exp(srow[j] - m_new);  // vectorized
            for (int64_t j = 0; j < n; ++j) sum += srow[j];
            l[gi] = l[gi] * rescale + sum;
            m[gi] = m_new;
          }
          // Each V row is loaded once for all g heads.
          for (int64_t j = 0; j < n; ++j) {
            const scalar_t* v = vb + (lo + j) * d;
            for (int64_t gi = 0; gi < g; ++gi) {
              const float w = s[gi * bs + j];
              float* a = acc.data() + gi * d;
              for (int64_t e = 0; e < d; ++e) a[e] += w * to_f(v[e]);
            }
          }
        }
      }
      for (int64_t gi = 0; gi < g; ++gi) {
        float* dst = o + (tok * hq + h * g + gi) * d;
        const float inv = 1.f / l[gi];
        for (int64_t e = 0; e < d; ++e) dst[e] = acc[gi * d + e] * inv;
      }
    }
  });
}

}  // namespace

// query: [T, Hq, D] float32, rotated at stored positions; out: [T, Hq, D] float32.
void segment_attention_decode(torch::Tensor query, torch::Tensor cache, bool k_transposed,
                              torch::Tensor row_token, torch::Tensor row_pair_ptr,
                              torch::Tensor pair_cos, torch::Tensor pair_sin,
                              torch::Tensor pair_piece_ptr, torch::Tensor piece_block,
                              torch::Tensor piece_lo, torch::Tensor piece_hi,
                              int64_t rotary_dim, bool neox, double scale, torch::Tensor out) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat && out.scalar_type() == torch::kFloat,
              "query and out must be float32");
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && cache.is_contiguous(),
              "query, out and cache must be contiguous");
  TORCH_CHECK(cache.dim() == 4 && cache.size(3) == 2 * query.size(2), "cache must be [blocks, heads, bs, 2*D]");
  TORCH_CHECK(query.size(1) % cache.size(1) == 0, "query heads must be a multiple of KV heads");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cache.scalar_type(), "segment_attention_decode", [&] {
    run_rows<scalar_t>(query, cache, k_transposed, row_token, row_pair_ptr, pair_cos, pair_sin,
                       pair_piece_ptr, piece_block, piece_lo, piece_hi, rotary_dim, neox, scale, out);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("segment_attention_decode", &segment_attention_decode,
        "Segment attention of single-token rows over vLLM's CPU paged KV cache");
}
