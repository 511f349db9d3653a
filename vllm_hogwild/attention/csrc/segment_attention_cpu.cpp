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
// per KV head takes a vector path (run_rows_shared), with 512-bit registers
// where the compiler targets AVX-512 (-march=native: the CPU it is built on),
// else 256-bit AVX2; `isa` chooses among the compiled ones (isas() lists them,
// widest first), the generic loops (run_rows) being the last:
// - a job is (KV head, a chunk of up to 4 rows); its readers (row, pair) are
//   walked piece by piece, in block order, so a piece that several rows read
//   (the shared prompt, every lane) is loaded once for up to 4 of them;
// - register tiles (piece_multi): 16 keys' scores, or 16 dims of V, for all
//   query heads of as many readers as the registers hold (AVX2: 16 registers,
//   2 readers of 1-3 heads; AVX-512: 32 registers and 32-key tiles, 4 readers of
//   1-3 heads) stay in registers while K or V streams through. A tile is two
//   registers so that every (reader, head) keeps two FMA chains in flight: with
//   one 16-lane register per tile the AVX-512 path ran at half AVX2's speed.
//   AVX-512 tiles need block size and head_dim multiples of 32; a cache with
//   multiples of 16 only takes the AVX2 tiles.
// bf16 and fp16 elements are widened to float32 as they load (exact). Where the
// compiler targets AVX512_BF16, the avx512_bf16 path scores a bf16 cache with the
// BF16 dot product (vdpbf16ps: two products per float32 lane): it pairs adjacent
// elements, and in the transposed K block those are two keys, so two rows of dims
// are interleaved first; the query is rounded to bf16 (round to nearest even) for
// it, the one rounding the other paths do not make. V is still widened (the
// weights stay float32). Other caches run that path as avx512.
// It merges a row's pieces in block order instead of view order: the same
// softmax, summed in another order (differences of float32 rounding).
//
// An FP8 cache (vLLM's kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2: bytes, each the
// float8 e4m3fn or e5m2 encoding of the value divided by its layer's scale) is
// read in place too: each byte widens to float32 through a 256-entry table of its
// encoding (exact), the K scale multiplies the softmax scale and the V scale the
// output. Both vector paths and the generic loops take it.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOGWILD_AVX2 1
#if defined(__AVX512F__)
#define HOGWILD_AVX512 1
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HOGWILD_AVX512_BF16 1
#endif
#endif
#endif

namespace {

// Finite stand-in for -inf (see the note on -ffast-math above): exp(kFloor - m) is 0.
constexpr float kFloor = -1e30f;

template <typename scalar_t>
inline float to_f(scalar_t x) { return static_cast<float>(x); }

// FP8 cache elements: one byte, decoded through the table of its encoding.
struct Fp8E4M3 { uint8_t bits; };
struct Fp8E5M2 { uint8_t bits; };

// The float32 value of every byte of an encoding (e4m3fn: bias 7, no infinities, S.1111.111 is NaN;
// e5m2: bias 15, exponent 31 is infinity or NaN). Built once, read by every thread.
struct Fp8Tables {
  float e4m3[256], e5m2[256];
  Fp8Tables() {
    for (int b = 0; b < 256; ++b) {
      const float sign = (b & 0x80) ? -1.f : 1.f;
      const int e4 = (b >> 3) & 0xF, m3 = b & 7;
      e4m3[b] = (e4 == 0xF && m3 == 7) ? std::numeric_limits<float>::quiet_NaN()
                : sign * (e4 == 0 ? std::ldexp(m3 / 8.f, -6) : std::ldexp(1.f + m3 / 8.f, e4 - 7));
      const int e5 = (b >> 2) & 0x1F, m2 = b & 3;
      e5m2[b] = e5 == 0x1F ? (m2 ? std::numeric_limits<float>::quiet_NaN() : sign * std::numeric_limits<float>::infinity())
                : sign * (e5 == 0 ? std::ldexp(m2 / 4.f, -14) : std::ldexp(1.f + m2 / 4.f, e5 - 15));
    }
  }
};
const Fp8Tables kFp8;

template <>
inline float to_f<Fp8E4M3>(Fp8E4M3 x) { return kFp8.e4m3[x.bits]; }
template <>
inline float to_f<Fp8E5M2>(Fp8E5M2 x) { return kFp8.e5m2[x.bits]; }


// Running softmax update of g heads over the scores of keys [lo, hi) (already
// scaled; head gi's at s + gi * bs); the scores become the unnormalised weights
// exp(s - m). Both paths use it.
inline void softmax_update(int64_t g, float* s, int64_t bs, int64_t lo, int64_t hi, int64_t d,
                           float* acc, float* m, float* l) {
  const int64_t n = hi - lo;
  for (int64_t gi = 0; gi < g; ++gi) {
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

// The paths `isa` names (see isas()).
enum Isa : int64_t { kGeneric = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

#ifdef HOGWILD_AVX2
// The vector operations a path needs, on its register width. A tile is two registers of
// keys (scores) or of dims (V), so that each (reader, head) keeps two independent FMA
// chains in flight; load() widens 16-bit cache elements to float32 (exact: bf16 is the
// high half of a float32).
struct Avx2 {
  using V = __m256;
  static constexpr bool kDotBf16 = false;  // scores of a bf16 cache with vdpbf16ps (scores_bf16)
  static constexpr int kLanes = 8;
  static constexpr int kTile = 16;
  static constexpr int kRegisters = 16;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const c10::BFloat16* p) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  }
#ifdef __F16C__
  static V load(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
  static V load(const Fp8E4M3* p) { return _mm256_i32gather_ps(kFp8.e4m3, bytes(p), 4); }
  static V load(const Fp8E5M2* p) { return _mm256_i32gather_ps(kFp8.e5m2, bytes(p), 4); }
  template <typename T>
  static __m256i bytes(const T* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
};

#ifdef HOGWILD_AVX512
struct Avx512 {
  using V = __m512;
  static constexpr bool kDotBf16 = false;
  static constexpr int kLanes = 16;
  static constexpr int kTile = 32;
  static constexpr int kRegisters = 32;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const c10::BFloat16* p) {
    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  }
  static V load(const c10::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const Fp8E4M3* p) { return _mm512_i32gather_ps(bytes(p), kFp8.e4m3, 4); }
  static V load(const Fp8E5M2* p) { return _mm512_i32gather_ps(bytes(p), kFp8.e5m2, 4); }
  template <typename T>
  static __m512i bytes(const T* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};

#ifdef HOGWILD_AVX512_BF16
struct Avx512Bf16 : Avx512 {
  static constexpr bool kDotBf16 = true;
};

constexpr int64_t kMaxDotDim = 256;  // head_dim up to which scores_bf16 keeps its bf16 queries on the stack

// Scores of R readers (G heads each) against the 32-key tiles of keys [lo, hi) of a bf16 K block,
// with vdpbf16ps. Per pair of dims (e, e+1): rows e and e+1 of the block are interleaved into
// (K[e][j], K[e+1][j]) pairs, keys 0-3, 8-11, ... in one register and 4-7, 12-15, ... in the
// other (unpack works within 128-bit lanes); each is dotted with the broadcast pair
// (q[e], q[e+1]) in bf16. A permute puts the keys back in order at the tile's end.
template <int G, int R>
void scores_bf16(const float* const* qr, const c10::BFloat16* kb, int64_t d, int64_t bs, int64_t lo, int64_t hi,
                 float sc, float* const* s) {
  alignas(64) uint16_t qb[R][G][kMaxDotDim];  // each reader's query heads in bf16: a uint32 is a (q[e], q[e+1])
  for (int r = 0; r < R; ++r)
    for (int gi = 0; gi < G; ++gi)
      for (int64_t e = 0; e < d; e += 32) {
        const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(qr[r] + gi * d + e + 16),
                                                _mm512_loadu_ps(qr[r] + gi * d + e));
        _mm512_store_si512(reinterpret_cast<__m512i*>(&qb[r][gi][e]), reinterpret_cast<const __m512i&>(x));
      }
  // Output lane o of the first half (keys 0-15) and second (16-31): from t0 (index < 16) or t1.
  alignas(64) static const int32_t kOrder[2][16] = {
      {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
      {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
  const __m512i first = _mm512_load_si512(kOrder[0]), second = _mm512_load_si512(kOrder[1]);
  const __m512 vsc = _mm512_set1_ps(sc);
  for (int64_t j0 = lo / 32 * 32; j0 < hi; j0 += 32) {
    __m512 t[R][G][2];
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi) t[r][gi][0] = t[r][gi][1] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; e += 2) {
      const __m512i a = _mm512_loadu_si512(kb + e * bs + j0), b = _mm512_loadu_si512(kb + (e + 1) * bs + j0);
      const __m512i klo = _mm512_unpacklo_epi16(a, b), khi = _mm512_unpackhi_epi16(a, b);
      for (int r = 0; r < R; ++r)
        for (int gi = 0; gi < G; ++gi) {
          uint32_t pair;
          std::memcpy(&pair, &qb[r][gi][e], sizeof(pair));
          const __m512i y = _mm512_set1_epi32(static_cast<int32_t>(pair));
          t[r][gi][0] = _mm512_dpbf16_ps(t[r][gi][0], reinterpret_cast<const __m512bh&>(klo),
                                         reinterpret_cast<const __m512bh&>(y));
          t[r][gi][1] = _mm512_dpbf16_ps(t[r][gi][1], reinterpret_cast<const __m512bh&>(khi),
                                         reinterpret_cast<const __m512bh&>(y));
        }
    }
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi) {
        float* out = s[r] + gi * bs + j0;
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutex2var_ps(t[r][gi][0], first, t[r][gi][1]), vsc));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_permutex2var_ps(t[r][gi][0], second, t[r][gi][1]), vsc));
      }
  }
}
#endif
#endif

// R readers of the same piece (each G query heads): every K and V tile is loaded once
// for all of them. Readers are distinct rows (their accumulators must not alias).
template <class I, int G, int R, typename scalar_t>
void piece_multi(const float* const* qr, const scalar_t* kb, const scalar_t* vb, int64_t d, int64_t bs,
                 int64_t lo, int64_t hi, float sc, float* const* s, float* const* acc, float* const* m,
                 float* const* l) {
  using V = typename I::V;
  constexpr int64_t kTile = I::kTile;
  constexpr int NV = kTile / I::kLanes;  // registers per tile
  const V vsc = I::set1(sc);
#ifdef HOGWILD_AVX512_BF16
  if constexpr (I::kDotBf16 && std::is_same<scalar_t, c10::BFloat16>::value) {
    scores_bf16<G, R>(qr, kb, d, bs, lo, hi, sc, s);
  } else
#endif
  for (int64_t j0 = lo / kTile * kTile; j0 < hi; j0 += kTile) {
    V t[R][G][NV];
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi)
        for (int v = 0; v < NV; ++v) t[r][gi][v] = I::zero();
    for (int64_t e = 0; e < d; ++e) {
      const scalar_t* kr = kb + e * bs + j0;
      V k[NV];
      for (int v = 0; v < NV; ++v) k[v] = I::load(kr + v * I::kLanes);
      for (int r = 0; r < R; ++r)
        for (int gi = 0; gi < G; ++gi) {
          const V y = I::bcast(qr[r] + gi * d + e);
          for (int v = 0; v < NV; ++v) t[r][gi][v] = I::fmadd(y, k[v], t[r][gi][v]);
        }
    }
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi)
        for (int v = 0; v < NV; ++v) I::store(s[r] + gi * bs + j0 + v * I::kLanes, I::mul(t[r][gi][v], vsc));
  }
  for (int r = 0; r < R; ++r) softmax_update(G, s[r], bs, lo, hi, d, acc[r], m[r], l[r]);
  for (int64_t e0 = 0; e0 < d; e0 += kTile) {
    V t[R][G][NV];
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi)
        for (int v = 0; v < NV; ++v) t[r][gi][v] = I::load(acc[r] + gi * d + e0 + v * I::kLanes);
    for (int64_t j = lo; j < hi; ++j) {
      const scalar_t* vr = vb + j * d + e0;
      V x[NV];
      for (int v = 0; v < NV; ++v) x[v] = I::load(vr + v * I::kLanes);
      for (int r = 0; r < R; ++r)
        for (int gi = 0; gi < G; ++gi) {
          const V w = I::bcast(s[r] + gi * bs + j);
          for (int v = 0; v < NV; ++v) t[r][gi][v] = I::fmadd(w, x[v], t[r][gi][v]);
        }
    }
    for (int r = 0; r < R; ++r)
      for (int gi = 0; gi < G; ++gi)
        for (int v = 0; v < NV; ++v) I::store(acc[r] + gi * d + e0 + v * I::kLanes, t[r][gi][v]);
  }
}

// Whether R readers of G heads fit the registers: their tiles, one tile of K or V, a broadcast.
template <class I, int G, int R>
constexpr bool fits() { return R * G * (I::kTile / I::kLanes) + I::kTile / I::kLanes + 1 <= I::kRegisters; }

// nr readers of one piece, in calls of as many readers as the registers hold.
template <class I, int G, typename scalar_t>
void pieces_multi(int64_t nr, const float* const* qr, const scalar_t* kb, const scalar_t* vb, int64_t d, int64_t bs,
                  int64_t lo, int64_t hi, float sc, float* const* s, float* const* acc, float* const* m,
                  float* const* l) {
  int64_t i = 0;
  if constexpr (fits<I, G, 4>()) {
    for (; i + 4 <= nr; i += 4)
      piece_multi<I, G, 4>(qr + i, kb, vb, d, bs, lo, hi, sc, s + i, acc + i, m + i, l + i);
  }
  if constexpr (fits<I, G, 2>()) {
    for (; i + 2 <= nr; i += 2)
      piece_multi<I, G, 2>(qr + i, kb, vb, d, bs, lo, hi, sc, s + i, acc + i, m + i, l + i);
  }
  for (; i < nr; ++i) piece_multi<I, G, 1>(qr + i, kb, vb, d, bs, lo, hi, sc, s + i, acc + i, m + i, l + i);
}

#endif

// The op's inputs as raw pointers and sizes, shared by both paths.
template <typename scalar_t>
struct Rows {
  int64_t num_rows, hq, d, heads, bs, g, half, block_stride, head_stride;
  bool neox;
  float sc, vs;  // the softmax scale (times an FP8 cache's K scale), and the V scale (1: not FP8)
  const float* q;
  const scalar_t* kv;
  float* o;
  const int64_t *rt, *rp, *pp, *pb, *plo, *phi;
  const float *pc, *ps;

  Rows(const torch::Tensor& query, const torch::Tensor& cache, const torch::Tensor& row_token,
       const torch::Tensor& row_pair_ptr, const torch::Tensor& pair_cos, const torch::Tensor& pair_sin,
       const torch::Tensor& pair_piece_ptr, const torch::Tensor& piece_block, const torch::Tensor& piece_lo,
       const torch::Tensor& piece_hi, int64_t rotary_dim, bool neox_, double scale, double k_scale,
       double v_scale, torch::Tensor& out)
      : num_rows(row_token.size(0)), hq(query.size(1)), d(query.size(2)), heads(cache.size(1)),
        bs(cache.size(2)), g(hq / heads), half(rotary_dim / 2), block_stride(heads * bs * 2 * d),
        head_stride(bs * 2 * d), neox(neox_), sc(static_cast<float>(scale * k_scale)),
        vs(static_cast<float>(v_scale)), q(query.data_ptr<float>()),
        kv(reinterpret_cast<const scalar_t*>(cache.data_ptr())), o(out.data_ptr<float>()),
        rt(row_token.data_ptr<int64_t>()),
        rp(row_pair_ptr.data_ptr<int64_t>()), pp(pair_piece_ptr.data_ptr<int64_t>()),
        pb(piece_block.data_ptr<int64_t>()), plo(piece_lo.data_ptr<int64_t>()),
        phi(piece_hi.data_ptr<int64_t>()), pc(pair_cos.data_ptr<float>()), ps(pair_sin.data_ptr<float>()) {}

  // The g query heads of KV head h of query token tok, rotated by pair p, into y [g, d].
  void rotate(int64_t tok, int64_t h, int64_t p, float* y) const {
    const float* c = pc + p * half;
    const float* sn = ps + p * half;
    for (int64_t gi = 0; gi < g; ++gi, y += d) {
      const float* x = q + (tok * hq + h * g + gi) * d;
      for (int64_t i = 0; i < d; ++i) y[i] = x[i];
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        y[a] = x[a] * c[i] - x[b] * sn[i];
        y[b] = x[b] * c[i] + x[a] * sn[i];
      }
    }
  }

  // Normalised output of query head gi of KV head h for query token tok.
  void write(int64_t tok, int64_t h, int64_t gi, const float* acc, float l) const {
    float* dst = o + (tok * hq + h * g + gi) * d;
    const float inv = vs / l;
    for (int64_t e = 0; e < d; ++e) dst[e] = acc[e] * inv;
  }
};

template <typename scalar_t>
void run_rows(const Rows<scalar_t>& rows, bool k_transposed) {
  const int64_t num_rows = rows.num_rows, d = rows.d, heads = rows.heads, bs = rows.bs, g = rows.g;
  const scalar_t* kv = rows.kv;
  const int64_t *rt = rows.rt, *rp = rows.rp, *pp = rows.pp, *pb = rows.pb, *plo = rows.plo, *phi = rows.phi;
  const float sc = rows.sc;
  const int64_t block_stride = rows.block_stride, head_stride = rows.head_stride;

  at::parallel_for(0, num_rows * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qr(g * d), acc(g * d), m(g), l(g), s(g * bs);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t r = job / heads, h = job % heads;
      const int64_t tok = rt[r];
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kFloor);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
        rows.rotate(tok, h, p, qr.data());
        for (int64_t pi = pp[p]; pi < pp[p + 1]; ++pi) {
          const int64_t lo = plo[pi], hi = phi[pi], n = hi - lo;
          const scalar_t* kb = kv + pb[pi] * block_stride + h * head_stride;
          const scalar_t* vb = kb + bs * d;
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
          for (int64_t gi = 0; gi < g; ++gi)
            for (int64_t j = 0; j < n; ++j) s[gi * bs + j] *= sc;
          softmax_update(g, s.data(), bs, 0, n, d, acc.data(), m.data(), l.data());  // scores at offset 0
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
      for (int64_t gi = 0; gi < g; ++gi) rows.write(tok, h, gi, acc.data() + gi * d, l[gi]);
    }
  });
}

#ifdef HOGWILD_AVX2
// Block-shared order: a job is (KV head, a chunk of rows); its readers (row, pair) are
// walked piece by piece, so that a piece several rows read is loaded once for them all.
template <class I, typename scalar_t>
bool run_rows_shared(const Rows<scalar_t>& rows) {
  const int64_t num_rows = rows.num_rows, d = rows.d, heads = rows.heads, bs = rows.bs, g = rows.g;
  if (!(g >= 1 && g <= 4) || bs % I::kTile || d % I::kTile) return false;
  const int64_t *rt = rows.rt, *rp = rows.rp, *pp = rows.pp, *pb = rows.pb, *plo = rows.plo, *phi = rows.phi;

  // Rows per chunk: enough jobs for every thread, at most 4 rows sharing a job.
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t want_jobs = 2 * threads;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(num_rows, (want_jobs + heads - 1) / heads));
  const int64_t rows_per = std::min<int64_t>(4, (num_rows + chunks - 1) / chunks);
  const int64_t num_chunks = (num_rows + rows_per - 1) / rows_per;

  at::parallel_for(0, num_chunks * heads, 1, [&](int64_t begin, int64_t end) {
    struct Entry { int64_t block, lo, hi, row, pair; };
    std::vector<Entry> entries;
    std::vector<float> qrot, acc, m, l, sbuf;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t h = job % heads, c = job / heads;
      const int64_t r0 = c * rows_per, r1 = std::min(num_rows, r0 + rows_per), nr = r1 - r0;
      const int64_t p0 = rp[r0], np = rp[r1] - p0;
      qrot.assign(np * g * d, 0.f);
      entries.clear();
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
          rows.rotate(rt[r], h, p, qrot.data() + (p - p0) * g * d);
          for (int64_t pi = pp[p]; pi < pp[p + 1]; ++pi) entries.push_back({pb[pi], plo[pi], phi[pi], r - r0, p - p0});
        }
      }
      std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.block != b.block ? a.block < b.block : a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi;
      });
      acc.assign(nr * g * d, 0.f);
      m.assign(nr * g, kFloor);
      l.assign(nr * g, 0.f);
      sbuf.resize(4 * g * bs);
      const float* qrs[4];
      float *ss[4], *accs[4], *ms[4], *ls[4];
      for (size_t i0 = 0; i0 < entries.size();) {
        size_t i1 = i0 + 1;
        // Readers of one call must be distinct rows (their accumulators must not alias): a
        // view may place one span twice (a section header), with two rotations.
        auto fresh_row = [&](size_t k) {
          for (size_t i = i0; i < k; ++i)
            if (entries[i].row == entries[k].row) return false;
          return true;
        };
        while (i1 < entries.size() && i1 - i0 < 4 && entries[i1].block == entries[i0].block &&
               entries[i1].lo == entries[i0].lo && entries[i1].hi == entries[i0].hi && fresh_row(i1)) ++i1;
        const int64_t n = i1 - i0;
        for (int64_t i = 0; i < n; ++i) {
          const Entry& en = entries[i0 + i];
          qrs[i] = qrot.data() + en.pair * g * d;
          ss[i] = sbuf.data() + i * g * bs;
          accs[i] = acc.data() + en.row * g * d;
          ms[i] = m.data() + en.row * g;
          ls[i] = l.data() + en.row * g;
        }
        const scalar_t* kb = rows.kv + entries[i0].block * rows.block_stride + h * rows.head_stride;
        const scalar_t* vb = kb + bs * d;
        const int64_t lo = entries[i0].lo, hi = entries[i0].hi;
        // The next block this job reads, on its way into the cache while this one is computed:
        // blocks lie anywhere in the cache, so the hardware prefetcher stops at each block's end.
        if (i1 < entries.size() && entries[i1].block != entries[i0].block) {
          const char* next = reinterpret_cast<const char*>(rows.kv + entries[i1].block * rows.block_stride +
                                                           h * rows.head_stride);
          const int64_t bytes = rows.head_stride * static_cast<int64_t>(sizeof(scalar_t));
          for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
        }
        switch (g) {
          case 1: pieces_multi<I, 1>(n, qrs, kb, vb, d, bs, lo, hi, rows.sc, ss, accs, ms, ls); break;
          case 2: pieces_multi<I, 2>(n, qrs, kb, vb, d, bs, lo, hi, rows.sc, ss, accs, ms, ls); break;
          case 3: pieces_multi<I, 3>(n, qrs, kb, vb, d, bs, lo, hi, rows.sc, ss, accs, ms, ls); break;
          default: pieces_multi<I, 4>(n, qrs, kb, vb, d, bs, lo, hi, rows.sc, ss, accs, ms, ls); break;
        }
        i0 = i1;
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t gi = 0; gi < g; ++gi)
          rows.write(rt[r], h, gi, acc.data() + ((r - r0) * g + gi) * d, l[(r - r0) * g + gi]);
    }
  });
  return true;
}
#endif

}  // namespace

// The paths this build has, widest first ("generic": run_rows, always there).
std::vector<std::string> isas() {
  std::vector<std::string> names;
#ifdef HOGWILD_AVX512_BF16
  names.push_back("avx512_bf16");
#endif
#ifdef HOGWILD_AVX512
  names.push_back("avx512");
#endif
#ifdef HOGWILD_AVX2
  names.push_back("avx2");
#endif
  names.push_back("generic");
  return names;
}

namespace {

// One cache element type: the widest compiled path that takes it, else the generic loops.
template <typename scalar_t>
void run_cache(const Rows<scalar_t>& rows, bool k_transposed, int64_t isa) {
#ifdef HOGWILD_AVX2
  constexpr bool readable = !std::is_same<scalar_t, double>::value
#ifndef __F16C__
                            && !std::is_same<scalar_t, c10::Half>::value
#endif
      ;
  if constexpr (readable) {
#ifdef HOGWILD_AVX512_BF16
    if constexpr (std::is_same<scalar_t, c10::BFloat16>::value) {  // other caches: the same code as avx512
      if (isa == kAvx512Bf16 && k_transposed && rows.d <= kMaxDotDim &&
          run_rows_shared<Avx512Bf16, scalar_t>(rows)) return;
    }
#endif
#ifdef HOGWILD_AVX512
    if ((isa == kAvx512 || isa == kAvx512Bf16) && k_transposed && run_rows_shared<Avx512, scalar_t>(rows)) return;
#endif
    // AVX2 tiles also serve an AVX-512 run whose block size is a multiple of 16, not of 32.
    if (isa != kGeneric && k_transposed && run_rows_shared<Avx2, scalar_t>(rows)) return;
  }
#endif
  run_rows<scalar_t>(rows, k_transposed);
}

}  // namespace

// query: [T, Hq, D] float32, rotated at stored positions; out: [T, Hq, D] float32.
// isa: the path (Isa), one that isas() lists. fp8: 0 for a float cache, 1 (e4m3fn) or 2 (e5m2) for an
// FP8 cache of bytes (uint8), whose values are the decoded bytes times k_scale (K) or v_scale (V).
void segment_attention_decode(torch::Tensor query, torch::Tensor cache, bool k_transposed,
                              torch::Tensor row_token, torch::Tensor row_pair_ptr,
                              torch::Tensor pair_cos, torch::Tensor pair_sin,
                              torch::Tensor pair_piece_ptr, torch::Tensor piece_block,
                              torch::Tensor piece_lo, torch::Tensor piece_hi,
                              int64_t rotary_dim, bool neox, double scale, torch::Tensor out, int64_t isa,
                              int64_t fp8, double k_scale, double v_scale) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat && out.scalar_type() == torch::kFloat,
              "query and out must be float32");
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && cache.is_contiguous(),
              "query, out and cache must be contiguous");
  TORCH_CHECK(cache.dim() == 4 && cache.size(3) == 2 * query.size(2), "cache must be [blocks, heads, bs, 2*D]");
  TORCH_CHECK(query.size(1) % cache.size(1) == 0, "query heads must be a multiple of KV heads");
  bool known = isa == kGeneric;
#ifdef HOGWILD_AVX2
  known = known || isa == kAvx2;
#endif
#ifdef HOGWILD_AVX512
  known = known || isa == kAvx512;
#endif
#ifdef HOGWILD_AVX512_BF16
  known = known || isa == kAvx512Bf16;
#endif
  TORCH_CHECK(known, "isa ", isa, " is not compiled in this build (see isas())");
  TORCH_CHECK(fp8 == 0 || cache.scalar_type() == torch::kByte, "an FP8 cache must be bytes (uint8)");
  TORCH_CHECK(fp8 >= 0 && fp8 <= 2, "fp8 must be 0 (not FP8), 1 (e4m3fn) or 2 (e5m2)");
  auto rows_of = [&](auto tag) {
    using scalar_t = decltype(tag);
    return Rows<scalar_t>(query, cache, row_token, row_pair_ptr, pair_cos, pair_sin, pair_piece_ptr, piece_block,
                          piece_lo, piece_hi, rotary_dim, neox, scale, fp8 ? k_scale : 1.0, fp8 ? v_scale : 1.0, out);
  };
  if (fp8 == 1) return run_cache(rows_of(Fp8E4M3{}), k_transposed, isa);
  if (fp8 == 2) return run_cache(rows_of(Fp8E5M2{}), k_transposed, isa);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cache.scalar_type(), "segment_attention_decode", [&] {
    run_cache(rows_of(scalar_t{}), k_transposed, isa);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("segment_attention_decode", &segment_attention_decode,
        "Segment attention of single-token rows over vLLM's CPU paged KV cache");
  m.def("isas", &isas, "The vector paths of this build, widest first, then \"generic\"");
}
