#!/usr/bin/env bash
# Mutation pass: plant one single-line bug at a time in the kernels (kernels/*.cu), the
# contract checks (host/protocol/contract.c, host/range/range.c), the seams (host/seam/: frames, socket
# I/O, the stream transport, TLS, NCCL), the stage runtime's parts, generation, the tokenizer
# files, the decode graph bookkeeping, the scheduler and the Python binding (python/meshkern/);
# rebuild the suite that owns the code,
# run its tests, and expect red. Prints a table: mutation, file, the suite that ran, caught
# yes/no. A mutation the suite does not catch is a test gap to close.
#
# Run by hand (not part of scripts/test.sh: a rebuild and a test run per mutation, tens of
# minutes in all on 2 cores):
#   scripts/mutate.sh [ID_REGEX]      only the mutations whose id matches ID_REGEX
# Only the suites those mutations name are built and run (each green unmutated first).
#
# The working tree is never edited: the tracked and untracked (not ignored) files are
# copied to build-mutate/src (only what changed since the last run, so rebuilds stay
# incremental), mutations are applied there one at a time, and the mutated file is
# restored after each mutation and on exit or interrupt (trap). The simulated suites are
# built in build-mutate/build (MESHKERN_CUDA=OFF).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/build-mutate"
SRC="$WORK/src"
BUILD="$WORK/build"
ONLY="${1:-.}"
JOBS="${JOBS:-2}"
export OPENBLAS_NUM_THREADS=1
# A mutated suite stops at its first failed test (GoogleTest reads this): red is all a
# mutation needs, and a broken kernel otherwise runs its whole op grid (minutes).
export GTEST_FAIL_FAST=1

# id ~ file ~ perl substitution (applied with -0: may span lines; must change the file) ~ tests
#   tests: ops:<gtest filter>  the kernel op grid under cudasim, forward and random order
#          host                the contract, bundle and parity suites
#          api                 the public-surface check (fallible MK_API functions clear the message,
#                              the others leave it alone)
#          sched               the placed pipeline on the cpu backend (every seam transport)
#          stage               the stage-process suite (meshkern stage: parity, faults, refusals)
#          native:<gtest filter>  the cpu backend's native kernels, pool and attention (test_cpu_native)
#          backend:<filter>    the cuda backend under cudasim (random stream interleaving)
#          seams:<filter>      the seam transports and their parts on the cpu backend (test_seams)
#          nccl:<filter>       the NCCL seam primitives, bootstrap and header coding under cudasim
#                              (test_nccl_seam_sim)
#          ncclpipe:<filter>   the NCCL seam transport on the cuda backend under cudasim
#                              (test_nccl_pipeline_sim)
#          stageunits:<filter> the stage runtime's control messages and request slots (test_stage_units)
#          sched:<filter>      test_pipeline_sched with a gtest filter (the cut chooser, refusals)
#          gen:<filter>        the generation loop (test_generate)
#          text:<filter>       the tokenizers, detokenizer and chat templates (test_tokenizer)
#          stage:<gtest filter>  the stage-process suite, only the matching cases
#          gtest:<target>:<gtest filter>  any GoogleTest binary of tests/ (built by that name)
#          ctest:<regex>       the ctest cases matching regex (the CLI's own checks; builds the CLI)
#          py:<pytest -k expr> the Python binding's suite (python/tests) on the copy's python/ and
#                              libmeshkern.so, in a venv of its own (build-mutate/pyvenv: cffi,
#                              numpy, pytest from PyPI)
# Only the targets and the unmutated suites the selected mutations need are built and run.
MUTATIONS=(
  "argmax.tie-inside-thread~kernels/argmax.cu~s/\(bi < 0 \|\| v > bv\)/(bi < 0 || v >= bv)/~ops:*Argmax*"
  "argmax.nan-may-win~kernels/argmax.cu~s/if \(!isnan\(v\) && \(/if ((/~ops:*Argmax*"
  "argmax.tie-across-threads~kernels/argmax.cu~s/av == bv && ai < bi/av == bv && ai > bi/~ops:*Argmax*"
  "rmsnorm.eps-constant~kernels/rmsnorm.cu~s/rsqrtf\(ss \/ \(float\)cols \+ eps\)/rsqrtf(ss \/ (float)cols + 1e-6f)/~ops:*RmsNorm*"
  "rmsnorm.eps-inside-mean~kernels/rmsnorm.cu~s/rsqrtf\(ss \/ \(float\)cols \+ eps\)/rsqrtf((ss + eps) \/ (float)cols)/~ops:*RmsNorm*"
  "rmsnorm.residual-not-written~kernels/rmsnorm.cu~s/residual\[off \+ c\] = v;/(void)0;/~ops:*RmsNorm*"
  "rope.rotation-sign~kernels/rope.cu~s/const float yb = __fadd_rn\(__fmul_rn\(xb, c\), __fmul_rn\(xa, s\)\);/const float yb = __fadd_rn(__fmul_rn(xb, c), -__fmul_rn(xa, s));/~ops:*Rope*"
  "rope.theta-exponent~kernels/rope.cu~s/-\(double\)\(2 \* i\) \/ \(double\)head_dim/-(double)(2 * i + 1) \/ (double)head_dim/~ops:*Rope*"
  "swiglu.silu-sign~kernels/swiglu.cu~s/expf\(-g\)/expf(g)/~ops:*Swiglu*"
  "embed.vocab-bound~kernels/embed.cu~s/\(size_t\)id >= vocab/(size_t)id > vocab/~ops:*Embed*"
  "prefill.causal-mask~kernels/attention_prefill.cu~s/t <= past \+ qi;/t <= past + qi + 1;/~ops:*Attention*"
  "prefill_tc.causal-tile-skip-one-tile~kernels/attention_prefill_tc.cu~s/if \(k0 >= w_key_end\) continue;/if (k0 + BK >= w_key_end) continue;/~ops:*AttentionPrefillTc*"
  "prefill_tc.rescale-dropped~kernels/attention_prefill_tc.cu~s/o_w\[my_r \* ldo \+ d\] \*= alpha;/(void)alpha;/~ops:*AttentionPrefillTc*"
  "prefill_tc.sum-not-rescaled~kernels/attention_prefill_tc.cu~s/l_run = l_run \* alpha \+ sum;/l_run = l_run + sum;/~ops:*AttentionPrefillTc*"
  "prefill_tc.gqa-head-map~kernels/attention_prefill_tc.cu~s/const int kvh = h \/ \(n_heads \/ n_kv_heads\);/const int kvh = h % n_kv_heads;/~ops:*AttentionPrefillTc*"
  "prefill_tc.backend-uses-it~kernels/attention_prefill_tc.cu~s/const int kvh = h \/ \(n_heads \/ n_kv_heads\);/const int kvh = h % n_kv_heads;/~backend:*TensorCorePrefill*"
  "prefill_tc.diagonal-mask~kernels/attention_prefill_tc.cu~s/k0 \+ c <= past \+ my_q/k0 + c < past + my_q/~ops:*AttentionPrefillTc*"
  "prefill_tc.bf16-copy-chunk~kernels/attention_prefill_tc.cu~s/tc_copy16\(v_s \+ kk \* ldk \+ d, /tc_copy16(v_s + kk * ldk + (d ^ 8), /~ops:*AttentionPrefillTc*"
  "prefill_tc.f16-cache-as-bf16~kernels/attention_prefill_tc.cu~s/if \(dtype == MK_DTYPE_F16\)/if (dtype == MK_DTYPE_BF16)/~ops:*AttentionPrefillTc*"
  "decode.no-scale~kernels/attention_decode.cu~s/q\[\(size_t\)h0 \* hd \+ i\] \* scale;/q[(size_t)h0 * hd + i];/~ops:*AttentionDecode*"
  "decode.gqa-kv-head-off-by-one~kernels/attention_decode.cu~s/\*kh = k_cache \+ \(size_t\)kvh \* hd/*kh = k_cache + (size_t)((kvh + 1) % n_kv_heads) * hd/~ops:*AttentionDecode*"
  "decode.split-overlaps-next~kernels/attention_decode.cu~s/k1 = k0 \+ share < n_keys \? k0 \+ share : n_keys;/k1 = k0 + share + 1 < n_keys ? k0 + share + 1 : n_keys;/~ops:*AttentionDecode*"
  "decode.split-skips-a-key~kernels/attention_decode.cu~s/const size_t k0 = \(size_t\)blockIdx.x \* share;/const size_t k0 = (size_t)blockIdx.x * share + (blockIdx.x ? 1 : 0);/~ops:*AttentionDecode*"
  "decode.no-online-rescale~kernels/attention_decode.cu~s/float a = acc\[g\]\[v\]\[e\] \* alpha;/float a = acc[g][v][e];/~ops:*AttentionDecode*"
  "decode.slot-combine-drops-last~kernels/attention_decode.cu~s/for \(int t = 0; t < kpb; \+\+t\) \{\n      const float \*c/for (int t = 0; t < kpb - 1; ++t) {\n      const float *c/~ops:*AttentionDecode*"
  "decode.combine-reads-every-split~kernels/attention_decode.cu~s/const int used = decode_used_splits\(decode_keys\(positions, max_keys\), splits\);/const int used = splits;/~ops:*Decode*"
  "decode.combine-drops-last-used-split~kernels/attention_decode.cu~s/return used < \(size_t\)splits \? \(int\)used : splits;/return used < (size_t)splits ? (int)used - (used > 1) : splits;/~ops:*Decode*"
  "gemv_set.third-matrix-as-second~kernels/gemv_dot.cuh~s/  o -= out\[1\];\n  return 2;/  o -= out[1];\n  return 1;/~ops:*GemvMulti*:*GemvQSet*"
  "decode.f16-read-as-bf16~kernels/attention_decode.cu~s/return mk_dev_f16_to_f32\(h\);/return mk_dev_bf16_to_f32(h);/~ops:*AttentionDecode*"
  "rope_kv.bf16-store-truncates~kernels/rope.cu~s/return mk_dev_f32_to_bf16\(x\);/return (uint16_t)(__float_as_uint(x) >> 16);/~ops:*RopeKv*"
  "prefill.f16-cache-read-as-bf16~kernels/attention_prefill.cu~s/return mk_dev_f16_to_f32\(\(uint16_t\)\(w & 0xffffu\)\);/return mk_dev_bf16_to_f32((uint16_t)(w & 0xffffu));/~ops:*PrefillHalfCache*"
  "backend.decode-ignores-kv-dtype~host/backend/cuda/backend_cuda.c~s/mk_kernel_attention_decode\(out, q, k_cache, v_cache, pages, mk_backend_kv_dtype\(b\),/mk_kernel_attention_decode(out, q, k_cache, v_cache, pages, MK_DTYPE_F32,/~backend:*HalfKv*"
  "add.overwrites~kernels/elementwise.cu~s/y\[i\] \+= x\[i\];/y[i] = x[i];/~ops:*AddAndLastRow*"
  "last_row.wrong-row~kernels/elementwise.cu~s/x \+ \(rows - 1\) \* cols/x + (rows > 1 ? rows - 2 : 0) * cols/~ops:*AddAndLastRow*"
  "kv_append.off-by-one~kernels/elementwise.cu~s/k_cache \+ past \* kv_dim/k_cache + (past ? past - 1 : 0) * kv_dim/~ops:*KvAppend*:*Decode*"
  "contract.alias-dropped~host/protocol/contract.c~s/\"LlamaModel\"\}/\"LlamaModels\"}/~host"
  "contract.tail-role~host/protocol/contract.c~s/tail = end == total - 1/tail = end >= total - 2/~host"
  "contract.sampling-top_p~host/protocol/contract.c~s/if \(mode != MK_SAMPLING_GREEDY\)/if (mode > MK_SAMPLING_TOP_P)/~host"
  "range.seam-check~host/range/check.c~s/h->next_layer != r->start/h->next_layer < r->start/~host"
  "range.normalized-accepted~host/range/check.c~s/if \(h->normalized\)/if (0 \&\& h->normalized)/~host"
  "range.token-bound~host/range/check.c~s/\(size_t\)ids\[i\] >= r->hp.vocab/(size_t)ids[i] > r->hp.vocab/~host"
  "range.message-removed~host/range/check.c~s/return mk_fail\(MK_ERR_HEAD_OWNS_EMBEDDING,[^;]*;/return MK_ERR_HEAD_OWNS_EMBEDDING;/~host"
  "sched.slot-pairs-shared~host/sched/link.c~s/link->fifo \? 0 : item->slot/0/~sched"
  "cuts.repeat-accepted~host/range/cuts.c~s/if \(i > 0 && c == cuts\[i - 1\]\)/if (0)/~gtest:test_api_rules:Cuts.*"
  "cuts.last-layer-accepted~host/range/cuts.c~s/c < 0 \|\| c >= last\)/c < 0 || c > last)/~gtest:test_api_rules:Cuts.*"
  "cuts.too-many-unbounded~host/range/cuts.c~s/n_cuts >= max_ranges \|\| //~gtest:test_api_rules:Cuts.*"
  "cuts.span-start-not-advanced~host/range/cuts.c~s/start = c \+ 1;/start = c;/~gtest:test_api_rules:Cuts.*"
  "options.larger-size-accepted~host/core/options.c~s/ \|\| size > current_size//~gtest:test_api_rules:StructSize.*"
  "options.older-struct-read-whole~host/core/options.c~s/memcpy\(dst, src, size\);/memcpy(dst, src, current_size);/~gtest:test_api_rules:StructSize.*"
  "options.seam-size-not-taken~host/seam/seam.c~s/return mk_options_take\(o, sizeof \*o, MK_SEAM_OPTIONS_V1_SIZE, given, \"mk_seam_options\"\);/*o = *given;\n    return MK_OK;/~gtest:test_api_rules:StructSize.*"
  "api.getter-clears~host/seam/seam.c~s/double mk_seam_seconds\(const mk_seam \*s\) \{/double mk_seam_seconds(const mk_seam *s) {\n    mk_clear_error();/~api"
  "api.getter-clears-at-run~host/seam/seam.c~s/double mk_seam_seconds\(const mk_seam \*s\) \{/double mk_seam_seconds(const mk_seam *s) {\n    mk_clear_error();/~gtest:test_api_rules:LastError.*"
  "api.getter-clears-through-a-call~host/pipeline/pipeline.c~s/bytes \+= mk_seam_bytes\(p->rx\[i\]\);/bytes += mk_seam_bytes(p->rx[i]) + mk_bundle_packed_size(NULL);/~api"
  "api.getter-clears-through-a-call-at-run~host/pipeline/pipeline.c~s/bytes \+= mk_seam_bytes\(p->rx\[i\]\);/bytes += mk_seam_bytes(p->rx[i]) + mk_bundle_packed_size(NULL);/~gtest:test_api_rules:LastError.*"
  "stage.digest-ignores-cuts~host/stage/stage_runtime.c~s/\(long long\)cuts\[i\]\);/0LL);/~stage"
  "stage.result-digest-unchecked~host/stage/stage_head.c~s/if \(strcmp\(info.runtime_recipe_digest/if (0 \&\& strcmp(info.runtime_recipe_digest/~stage"
  "stage.unstarted-not-reported~host/stage/stage_head.c~s/for \(size_t i = l.next; report/for (size_t i = l.next + 1; report/~stage"
  "stage.hop-stats-refused~host/stage/control.c~s/t > MK_CTL_LAST/t > MK_CTL_DONE/~stage"
  "stage.hop-receipts-miscounted~host/stage/stage_member.c~s/st->counts.received\+\+;/st->counts.received += 2;/~stage"
  "native.swiglu-up-skipped~host/backend/cpu/cpu_native.c~s/        mk_native_part_rows\(j, &j->part\[1\], begin, end\);\n//~native:*SharedAndSwiglu*"
  "native.shared-part-skips-item~host/backend/cpu/cpu_native.c~s/            begin = stop;/            begin = stop + 1;/~native:*SharedAndSwiglu*"
  "pool.runs-overlap~host/backend/cpu/cpu_pool.c~s/\(size_t\)\(next \+ take\) \* p->chunk < p->n \? \(size_t\)\(next \+ take\) \* p->chunk/(size_t)(next + take + 1) * p->chunk < p->n ? (size_t)(next + take + 1) * p->chunk/~native:*CpuPool*"
  "attention.exp-coefficient~host/backend/cpu/cpu_attention_fast.c~s/8\.3334519073e-3f/8.3334519073e-2f/~native:*Attention*"
  "attention.two-pass-values-from-keys~host/backend/cpu/cpu_attention_fast.c~s/AXPY\(acc, p, vh \+/AXPY(acc, p, kh +/~native:*NativeAttention*"
  "attention.axpy-avx2-tail-dropped~host/backend/cpu/cpu_attention_fast.c~s/    for \(; d < n; d\+\+\) acc\[d\] \+= p \* v\[d\];\n\}\n\nMK_ATTENTION_TWO_PASS\(MK_AVX2_FMA/}\n\nMK_ATTENTION_TWO_PASS(MK_AVX2_FMA/~native:*NativeAttention*"
  "attention.tail-unmasked~host/backend/cpu/cpu_attention_fast.c~s/mk_lanes_below\(rest\);/mk_lanes_below(8);/~native:*Attention*"
  "w8.word-transpose-swapped~host/backend/cpu/cpu_quant_avx2.c~s/const __m256i v\[4\] = \{_mm256_unpacklo_epi64\(t0, t2\), _mm256_unpackhi_epi64\(t0, t2\),/const __m256i v[4] = {_mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t0, t2),/~native:*SimdDots*"
  "w8.high-half-rows-shifted~host/backend/cpu/cpu_quant_avx2.c~s/\(qs \+ \(i \+ 4\) \* rb\)/(qs + (i + 3) * rb)/~native:*NRowDots*"
  "w8.high-nibbles-unmasked~host/backend/cpu/cpu_quant_avx2.c~s/g\[k \+ 4\] = _mm256_and_si256\(_mm256_srli_epi16\(v\[k\], 4\), m4\);/g[k + 4] = _mm256_srli_epi16(v[k], 4);/~native:*SimdDots*"
  "w8.scales-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/memcpy\(&h\[i\], p \+ i \* rb, sizeof h\[i\]\);/memcpy(\&h[i], p, sizeof h[i]);/~native:*NRowDots*"
  "w8.q4_0-offset-of-7~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_epi32\(-8 \* \(xb\)->sum\)/_mm256_set1_epi32(-7 * (xb)->sum)/~native:*SimdDots*"
  "w8.q4_1-min-dropped~host/backend/cpu/cpu_quant_avx2.c~s/#define CX_Q4_1_MIN\(acc, m, xb\) _mm256_fmadd_ps\(m, _mm256_set1_ps\(\(xb\)->s\), acc\)/#define CX_Q4_1_MIN(acc, m, xb) (acc)/~native:*SimdDots*"
  "w8.q4_1-mins-are-the-scales~host/backend/cpu/cpu_quant_avx2.c~s/cx_f16x8\(\(p\) \+ 2, rb\)/cx_f16x8((p), rb)/~native:*SimdDots*"
  "w8.avx2-second-group-skipped~host/backend/cpu/cpu_quant_avx2.c~s/CX_UNROLL for \(int k = 1; k < 8; k\+\+\) p = _mm256_add_epi16/CX_UNROLL for (int k = 2; k < 8; k++) p = _mm256_add_epi16/~native:*SimdDots*"
  "w8.vnni-last-group-skipped~host/backend/cpu/cpu_quant_avx2.c~s/CX_UNROLL for \(int k = 0; k < 8; k\+\+\) init = DPBUSD\(init, g\[k\]/CX_UNROLL for (int k = 0; k < 7; k++) init = DPBUSD(init, g[k]/~native:*Vnni*"
  "w8.q8_0-vnni-sign-dropped~host/backend/cpu/cpu_quant_avx2.c~s/init = DPBUSD\(init, _mm256_sign_epi8\(g\[k\], g\[k\]\), _mm256_sign_epi8\(cx_group4\(q \+ 4 \* k\), g\[k\]\)\);/init = DPBUSD(init, _mm256_sign_epi8(g[k], g[k]), cx_group4(q + 4 * k));/~native:*Vnni*"
  "w8.q8_0-avx2-sign-dropped~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_sign_epi8\(cx_group4\(q \+ 4 \* k\), g\[k\]\)\),\n/cx_group4(q + 4 * k)),\n/~native:*SimdDots*"
  "w8.q8_0-byte-transpose-low-halves-twice~host/backend/cpu/cpu_quant_avx2.c~s/g\[k \+ 4\] = _mm256_permute2x128_si256\(u\[k\], u\[4 \+ k\], 0x31\);/g[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);/~native:*SimdDots*"
  "w8.scale-of-activation-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_mul_ps\(d, _mm256_set1_ps\(xb->d\)\)/_mm256_mul_ps(d, _mm256_set1_ps(x[0][b].d))/~native:*NRowDots*"
  "w8.values-of-activation-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/const mk_q8_block \*xb = &x\[r\]\[b\];/const mk_q8_block *xb = \&x[0][b];/~native:*NRowDots*"
  "w8.avx512-kernels-four-rows~host/backend/cpu/cpu_quant_avx2.c~s/vnni512, CX_BY_ROWS8, ROWS8\)/vnni512, CX_BY_ROWS8, ROWS4)/~native:*NRowDots*"
  "w8.block-sum-half~host/backend/cpu/cpu_quant_avx2.c~s/out\[b\]\.sum = lo \+ hi;/out[b].sum = lo;/~native:*SimdQuantization*"
  "native.q4_0-without-eight-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q4_0: return q->dot8_q4_0;\n//~native:*NRowDots*"
  "q5.fifth-bits-of-the-wrong-byte~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_epi8\(\(char\)\(k \/ 2\)\)/_mm256_set1_epi8((char)(k % 2))/~native:*SimdDots*"
  "q5.odd-groups-test-the-low-bits~host/backend/cpu/cpu_quant_avx2.c~s/k % 2 \? \(int\)0x80402010 : 0x08040201/0x08040201/~native:*SimdDots*"
  "q5.fifth-bit-as-8~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_and_si256\(set, sixteen\)/_mm256_and_si256(set, _mm256_set1_epi8(8))/~native:*SimdDots*"
  "q5.fifth-bits-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/memcpy\(&h\[i\], qh \+ i \* rb, sizeof h\[i\]\);/memcpy(\&h[i], qh, sizeof h[i]);/~native:*NRowDots*"
  "q5_0.offset-of-15~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_epi32\(-16 \* \(xb\)->sum\)/_mm256_set1_epi32(-15 * (xb)->sum)/~native:*SimdDots*"
  "q5_1.min-dropped~host/backend/cpu/cpu_quant_avx2.c~s/#define CX_Q5_1_MIN\(acc, m, xb\) _mm256_fmadd_ps\(m, _mm256_set1_ps\(\(xb\)->s\), acc\)/#define CX_Q5_1_MIN(acc, m, xb) (acc)/~native:*SimdDots*"
  "q5.avx2-eight-groups-in-i16~host/backend/cpu/cpu_quant_avx2.c~s/Q5_0, cx_five_sums_avx2, ROWS4\)/Q5_0, cx_nibble_sums_avx2, ROWS4)/~native:*DocumentedOrder*"
  "q5.avx2-half-group-skipped~host/backend/cpu/cpu_quant_avx2.c~s/CX_UNROLL for \(int k = h \+ 1; k < h \+ 4; k\+\+\)/CX_UNROLL for (int k = h + 1; k < h + 3; k++)/~native:*SimdDots*"
  "q5.portable-offset-of-15~host/backend/cpu/cpu_quant.c~s/cq_five_isum\(w \+ 2, x\[b\]\.q, 16\)/cq_five_isum(w + 2, x[b].q, 15)/~native:*EveryFormat*"
  "q5.portable-high-half-takes-the-low-bits~host/backend/cpu/cpu_quant.c~s/\(\(\(qh >> \(j \+ 16\)\) & 1u\) << 4\)/(((qh >> j) \& 1u) << 4)/~native:*EveryFormat*"
  "q5_1.portable-min-dropped~host/backend/cpu/cpu_quant.c~s/\(float\)cq_five_isum\(w \+ 4, x\[b\]\.q, 0\) \+ cq_f16_at\(w \+ 2\) \* x\[b\]\.s/(float)cq_five_isum(w + 4, x[b].q, 0)/~native:*EveryFormat*"
  "native.q5_0-without-eight-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q5_0: return q->dot8_q5_0;\n//~native:*NRowDots*"
  "native.q5_1-stored-as-f32~host/backend/cpu/cpu_quant.c~s/case MK_GGML_TYPE_Q5_0: case MK_GGML_TYPE_Q5_1:\n/case MK_GGML_TYPE_Q5_0:\n/~native:*NativeWeightStore*"
  "native.q8_0-without-eight-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q8_0: return q->dot8_q8_0;\n//~native:*NRowDots*"
  "native.rows8-tail-written-from-its-first-row~host/backend/cpu/cpu_native.c~s/for \(size_t i = o - first; i < o - first \+ take; i\+\+\)/for (size_t i = 0; i < take; i++)/~native:*EveryFormat*"
  "native.rows8-small-part-reads-row-zero~host/backend/cpu/cpu_native.c~s/p->qdot8\(p->data \+ o \* p->row_bytes, 0, xq, n, in, v\);/p->qdot8(p->data, 0, xq, n, in, v);/~native:*EveryFormat*"
  "native.rows8-group-rows-from-zero~host/backend/cpu/cpu_native.c~s/xq\[k\] = j->ctx->xq \+ \(r \+ k\) \* per_row/xq[k] = j->ctx->xq + k * per_row/~native:*BatchRows*"
  "native.blocks-of-32-take-the-tiles~host/backend/cpu/cpu_native.c~s/return mk_cpu_quant_dot8_for\(ctx->kernels, format\) \|\| mk_cpu_quant_kdotn_for/return mk_cpu_quant_kdotn_for/~native:*Threshold*"
  "quant.vnni-never-chosen~host/backend/cpu/cpu_quant.c~s/if \(vnni && !\(cap/if (0 \&\& vnni \&\& !(cap/~native:*Vnni*"
  "quant.vnni-cpuid-bit-inverted~host/backend/cpu/cpu_quant_avx2.c~s/return a & \(1u << 4\);/return !(a \& (1u << 4));/~native:*Vnni*"
  "attention.vnni-portable~host/backend/cpu/cpu_attention_fast.c~s/kernels != mk_cpu_quant_portable\(\)/kernels == mk_cpu_quant_avx2()/~native:*Vnni*"
  "quant.avx512-vnni-never-chosen~host/backend/cpu/cpu_quant_avx2.c~s/\? &cx_vnni : mk_cpu_quant_avx512_vnni\(\)/? \&cx_vnni : NULL/~native:*Vnni*"
  "native.dotn-group-short~host/backend/cpu/cpu_native.c~s/const size_t n = j->rows - r < group \? j->rows - r : group;/const size_t n = j->rows - r < group ? j->rows - r : group - 1;/~gtest:test_batch_forward:*cpu_native*"
  "q4_k.dotn-row-values-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_maddubs_epi16\(q\[j\], cx_loadu\(xb->q \+ 32 \* \(j\)\)\)/_mm256_maddubs_epi16(q[j], cx_loadu(x[0][sb].q + 32 * (j)))/~native:*NRowDots*"
  "q4_k.dotn-mins-sums-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_madd_epi16\(cx_loadu\(xb->sums\), mins\)/_mm256_madd_epi16(cx_loadu(x[0][sb].sums), mins)/~native:*NRowDots*"
  "q4_k.dotn-scale-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_ps\(xb->d\), t/_mm256_set1_ps(x[0][sb].d), t/~native:*NRowDots*"
  "q4_k.sub-block-scale-of-its-neighbour~host/backend/cpu/cpu_quant_avx2.c~s/PRODUCT\(j\), SCALE\[j\]\)/PRODUCT(j), SCALE[j ^ 1])/~native:*SimdDots*"
  "k_quants.second-chain-dropped~host/backend/cpu/cpu_quant_avx2.c~s/isum = _mm256_add_epi32\(chain_\[0\], chain_\[1\]\);/isum = chain_[0];/~native:*SimdDots*"
  "q4_k.mins-not-spread-over-groups~host/backend/cpu/cpu_quant_avx2.c~s/_mm_unpacklo_epi8\(mn8, mn8\)/_mm_unpacklo_epi8(mn8, _mm_setzero_si128())/~native:*SimdDots*"
  "q4_k.mins-subtracted-as-added~host/backend/cpu/cpu_quant_avx2.c~s/const __m256 t = _mm256_fnmadd_ps\(vdmin/const __m256 t = _mm256_fmadd_ps(vdmin/~native:*SimdDots*"
  "q4_k.vnni-scales-as-values~host/backend/cpu/cpu_quant_avx2.c~s/return DPWSSD\(acc, p, w\);/return DPWSSD(acc, p, p);/~native:*Vnni*"
  "native.q4_k-without-n-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q4_K: return q->dotn_q4_k;\n//~native:*NRowDots*"
  "q6_k.dotn-scale-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_ps\(d \* xb->d\)/_mm256_set1_ps(d * x[0][sb].d)/~native:*NRowDots*"
  "q6_k.dotn-offset-sums-of-row-zero~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_madd_epi16\(cx_loadu\(xb->sums\), scales16\)/_mm256_madd_epi16(cx_loadu(x[0][sb].sums), scales16)/~native:*NRowDots*"
  "q6_k.offset-times-16~host/backend/cpu/cpu_quant_avx2.c~s/CX_K_OFFSET_ROWS\(OPS, R, 5\)/CX_K_OFFSET_ROWS(OPS, R, 4)/~native:*SimdDots*"
  "k_pair_scales.offset-scales-unsigned~host/backend/cpu/cpu_quant_avx2.c~s/\*scales16 = _mm256_cvtepi8_epi16\(sc\);/*scales16 = _mm256_cvtepu8_epi16(sc);/~native:*SimdDots*"
  "q5_k.fifth-bit-of-the-next-sub-block~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_srli_epi16\(bits, u\)/_mm256_srli_epi16(bits, u ^ 1)/~native:*SimdDots*"
  "q5_k.fifth-bits-dropped~host/backend/cpu/cpu_quant_avx2.c~s/#define CX_Q5_K_FIFTH\(q, w\) cx_k5_fifth\(q, \(w\) \+ 16\)/#define CX_Q5_K_FIFTH(q, w) (void)0/~native:*SimdDots*"
  "q5_k.fifth-bit-as-8~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_and_si256\(_mm256_srli_epi16\(bits, u\), one\), 4\)/_mm256_and_si256(_mm256_srli_epi16(bits, u), one), 3)/~native:*SimdDots*"
  "q5_k.nibbles-read-from-qh~host/backend/cpu/cpu_quant_avx2.c~s/#define CX_Q5_K_QS 48/#define CX_Q5_K_QS 16/~native:*SimdDots*"
  "q5_k.portable-fifth-bit-of-the-neighbour~host/backend/cpu/cpu_quant.c~s/\(\(qh\[l\] >> j\) & 1\) << 4/((qh[l] >> (j ^ 1)) \& 1) << 4/~native:*EveryFormat*"
  "k2_3.portable-two-bits-plane-of-the-half~host/backend/cpu/cpu_quant.c~s/>> \(2 \* \(\(i % 128\) \/ 32\)\)\) & 3;/>> (2 * ((i % 64) \/ 32))) \& 3;/~native:*EveryFormat*"
  "q3_k.portable-third-bit-of-the-wrong-plane~host/backend/cpu/cpu_quant.c~s/\(hmask\[i % 32\] >> \(i \/ 32\)\) & 1;/(hmask[i % 32] >> (i \/ 64)) \& 1;/~native:*EveryFormat*"
  "native.q5_k-without-n-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q5_K: return q->dotn_q5_k;\n//~native:*NRowDots*"
  "k_pair_scales.scales-of-the-next-group~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_epi16\(\(short\)\(0x0100 \+ 0x0202 \* i\)\)/_mm256_set1_epi16((short)(0x0100 + 0x0202 * ((i + 1) % 8)))/~native:*SimdDots*"
  "q3_k.third-bit-of-the-neighbour~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_srli_epi16\(hm, i\)/_mm256_srli_epi16(hm, i ^ 1)/~native:*SimdDots*"
  "q3_k.offset-of-2~host/backend/cpu/cpu_quant_avx2.c~s/CX_K_OFFSET_ROWS\(OPS, R, 2\)/CX_K_OFFSET_ROWS(OPS, R, 1)/~native:*SimdDots*"
  "q3_k.two-bits-of-the-next-shift~host/backend/cpu/cpu_quant_avx2.c~s/2 \* \(i % 4\)\), m2\)/2 * ((i + 1) % 4)), m2)/~native:*SimdDots*"
  "q3_k.portable-offset-of-3~host/backend/cpu/cpu_quant.c~s/\| third << 2\) - 4\)/| third << 2) - 3)/~native:*EveryFormat*"
  "q3_k.scale-top-bits-of-the-wrong-byte~host/model/gguf.h~s/\(unsigned\)\(s\[8 \+ i % 4\] >> \(2 \* \(i \/ 4\)\)\) & 3u;/(unsigned)(s[8 + i \/ 4] >> (2 * (i % 4))) \& 3u;/~gtest:test_gguf_dequant:*"
  "native.q3_k-without-n-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q3_K: return q->dotn_q3_k;\n//~native:*NRowDots*"
  "native.q6_k-without-n-row-dot~host/backend/cpu/cpu_quant.c~s/        case MK_GGML_TYPE_Q6_K: return q->dotn_q6_k;\n//~native:*NRowDots*"
  "quant_k.group-sums-of-the-first-half~host/backend/cpu/cpu_quant_avx2.c~s/out\[b\]\.sums\[2 \* i \+ 1\] = \(int16_t\)hi;/out[b].sums[2 * i + 1] = (int16_t)lo;/~native:*Quantization*"
  "quant_k.scale-per-block-of-32~host/backend/cpu/cpu_quant_avx2.c~s/cx_absmax_bits\(xb, MK_Q8K_BLOCK\)/cx_absmax_bits(xb, MK_Q8_BLOCK)/~native:*Quantization*"
  "quant_k.portable-sums-of-15~host/backend/cpu/cpu_quant.c~s/cq_round\(out\[b\]\.q \+ 16 \* g, xb \+ 16 \* g, 16, id\)/cq_round(out[b].q + 16 * g, xb + 16 * g, 15, id)/~native:*Quantization*"
  "quant.portable-scale-of-half-the-block~host/backend/cpu/cpu_quant.c~s/out\[b\]\.d = cq_scale\(x \+ b \* MK_Q8_BLOCK, MK_Q8_BLOCK, &id\);/out[b].d = cq_scale(x + b * MK_Q8_BLOCK, MK_Q8_BLOCK \/ 2, \&id);/~native:*Quantization*"
  "native.tiles-held-for-every-format~host/backend/cpu/backend_cpu.c~s/if \(mk_cpu_native_takes_tiles\(&cb->native, w->format\)\) cb->tiles_wanted = true;/cb->tiles_wanted = true;/~native:*WeightTiles*"
  "native.tiles-never-held~host/backend/cpu/backend_cpu.c~s/if \(!cb->tiles_wanted \|\| !cb->wtile_plan \|\| cb->native.wtile\) return MK_OK;/return MK_OK;/~native:*WeightTiles*"
  "native.tiles-dropped-by-a-second-reserve~host/backend/cpu/backend_cpu.c~s/    return cpu_reserve_tiles\(cb\);\n\}/    return MK_OK;\n}/~native:*WeightTiles*"
  "model.load-skips-the-finite-check~host/model/model_gguf.c~s/if \(t\) MK_TRY\(mk_model_check_finite\(name, t->type, t->data, t->n_bytes\)\);/(void)t;/~gtest:test_native_model:*NonFinite*"
  "range.native-load-skips-the-finite-check~host/range/weights.c~s/if \(stored\) MK_TRY\(mk_model_check_finite\(name, type, src, src_bytes\)\);/(void)0;/~gtest:test_native_model:*NonFinite*"
  "gguf.finite-second-scale-unchecked~host/model/gguf_dequant.c~s/for \(int k = 0; k < 2; k\+\+\)\n            if \(l->f16_scales/for (int k = 0; k < 1; k++)\n            if (l->f16_scales/~gtest:test_native_model:*NonFinite*"
  "gguf.finite-f16-inf-missed~host/model/gguf_dequant.c~s/return \(gq_u16\(p\) & 0x7c00u\) == 0x7c00u;/return (gq_u16(p) \& 0x7e00u) == 0x7e00u;/~gtest:test_native_model:*NonFinite*"
  "gguf.finite-q6k-scale-offset~host/model/gguf_dequant.c~s/\{MK_GGML_TYPE_Q6_K, .Q6_K., 256, 210, \{208, -1\}\}/{MK_GGML_TYPE_Q6_K, \x22Q6_K\x22, 256, 210, {206, -1}}/~gtest:test_native_model:*NonFinite*"
  "quant.inf-taken-as-finite~host/backend/cpu/cpu_quant.h~s/if \(amax_bits >= 0x7f800000u\)/if (amax_bits > 0x7f800000u)/~native:*NonFinite*"
  "quant.subnormal-d-kept~host/backend/cpu/cpu_quant.h~s/if \(!\(d >= FLT_MIN\)\)/if (!(d > 0.0f))/~native:*NonFinite*"
  "quant.simd-nan-block-rounded~host/backend/cpu/cpu_quant_avx2.c~s/    if \(id == 0.0f\) \{\n        memset\(q, 0, 32\);/    if (0) {\n        memset(q, 0, 32);/~native:*NonFinite*"
  "quant.simd-max-keeps-the-sign~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_set1_epi32\(0x7fffffff\)/_mm256_set1_epi32(-1)/~native:*Quantization*:*NonFinite*"
  "quant.portable-max-keeps-the-sign~host/backend/cpu/cpu_quant.c~s/u &= 0x7fffffffu;/(void)0;/~native:*Quantization*:*NonFinite*"
  "k_pair_scales.even-and-odd-swapped~host/backend/cpu/cpu_quant_avx2.c~s/_mm_setr_epi8\(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15\)/_mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14)/~native:*SimdDots*"
  "iq4_nl.lut-lookup-skipped~host/backend/cpu/cpu_quant_avx2.c~s/CX_UNROLL for \(int k = 0; k < 8; k\+\+\) g\[k\] = _mm256_shuffle_epi8\(lut, g\[k\]\);/(void)lut;/~native:*SimdDots*"
  "iq4_xs.high-nibbles-as-low~host/backend/cpu/cpu_quant_avx2.c~s/_mm_and_si128\(_mm_srli_epi16\(raw, 4\), m4\)/_mm_and_si128(raw, m4)/~native:*SimdDots*"
  "iq4_xs.scale-of-the-next-sub-block~host/backend/cpu/cpu_quant_avx2.c~s/mk_iq4xs_scale\(w, ib\)\)/mk_iq4xs_scale(w, (ib + 1) % 8))/~native:*SimdDots*"
  "iq4_xs.weight-sign-dropped~host/backend/cpu/cpu_quant_avx2.c~s/_mm256_sign_epi8\(cx_loadu\(xb->q \+ 32 \* \(j\)\), v\[j\]\)/cx_loadu(xb->q + 32 * (j))/~native:*SimdDots*"
  "iq4_xs.portable-high-nibble-as-low~host/backend/cpu/cpu_quant.c~s/mk_iq4_values\[qs\[j\] >> 4\] \* y\[j \+ 16\]/mk_iq4_values[qs[j] \& 0x0f] * y[j + 16]/~native:*EveryFormat*"
  "native.iq4_nl-not-kept~host/backend/cpu/cpu_quant.c~s/case MK_GGML_TYPE_Q6_K: case MK_GGML_TYPE_IQ4_NL: case MK_GGML_TYPE_IQ4_XS:/case MK_GGML_TYPE_Q6_K: case MK_GGML_TYPE_IQ4_XS:/~native:*NativeWeightStore*"
  "gguf.iq4-value-table~host/model/gguf.h~s/69, 89, 113\}/69, 89, 112}/~gtest:test_gguf_dequant:*"
  "gguf.iq4xs-scale-high-bits~host/model/gguf.h~s/hi = \(h >> \(2 \* ib\)\) & 3u;/hi = (h >> ib) \& 3u;/~gtest:test_gguf_dequant:*"
  "q2_k.scales-as-mins~host/backend/cpu/cpu_quant_avx2.c~s/cx_k_pair_scales\(_mm_and_si128\(packed, m4\), &scales16, scale\);/cx_k_pair_scales(_mm_and_si128(_mm_srli_epi16(packed, 4), m4), \&scales16, scale);/~native:*SimdDots*"
  "q2_k.values-of-the-next-shift~host/backend/cpu/cpu_quant_avx2.c~s/2 \* \(j % 4\)\), m2\);/2 * ((j + 1) % 4)), m2);/~native:*SimdDots*"
  "q2_k.portable-min-dropped~host/backend/cpu/cpu_quant.c~s/imin \+= \(w\[g\] >> 4\) \* x->sums\[g\];/(void)0;/~native:*EveryFormat*"
  "q3_k.simd-scale-top-bits-transposed~host/backend/cpu/cpu_quant_avx2.c~s/_mm_setr_epi32\(0, 2, 4, 6\)/_mm_setr_epi32(0, 4, 2, 6)/~native:*SimdDots*"
  "q3_k.simd-scale-high-nibbles-unshifted~host/backend/cpu/cpu_quant_avx2.c~s/_mm_and_si128\(_mm_srli_epi16\(b8, 4\), m4\)/_mm_and_si128(b8, m4)/~native:*SimdDots*"
  "q3_k.simd-scale-offset-31~host/backend/cpu/cpu_quant_avx2.c~s/_mm_set1_epi8\(32\)\);/_mm_set1_epi8(31));/~native:*SimdDots*"
  "native.dotn-group-not-the-tables~host/backend/cpu/cpu_native.c~s/group = j->ctx->kernels->dotn_rows;/group = MK_QDOTN_MAX_ROWS;/~native:*BatchRowsEqual*"
  "cpu.eight-rows-dispatch-seven~host/backend/cpu/cpu_quant_avx2.c~s/default: NAME##_8\(w, x, n, out\);/default: NAME##_7(w, x, n, out);/~native:*NRowDots*"
  "cpu.avx512-table-four-rows~host/backend/cpu/cpu_quant_avx2.c~s/CX_VNNI_TABLE\(.avx512-vnni., vnni512, 8\)/CX_VNNI_TABLE(\x22avx512-vnni\x22, vnni512, 4)/~native:*NRowDots*"
  "dequant_q.slice-row~kernels/dequant_q.cu~s/\(int64_t\)\(row0 \+ row\)/(int64_t)row0/~ops:*DequantQ*"
  "dequant_q.id-bound~kernels/dequant_q.cu~s/\(size_t\)src >= n_src_rows/(size_t)src > n_src_rows/~ops:*DequantQ*"
  "gguf_blocks.q4_0-offset~kernels/gguf_blocks.cuh~s/return d \* \(float\)\(\(int\)u - 8\);/return d * (float)((int)u - 7);/~ops:*Gemv*"
  "gguf_blocks.q5-high-fifth-bit-of-the-low-value~kernels/gguf_blocks.cuh~s/\(\(qh >> \(4 \* p \+ i \+ 16\)\) & 1u\)/((qh >> (4 * p + i)) \& 1u)/~ops:*Gemv*"
  "gguf_blocks.q4_1-q5_1-min-subtracted~kernels/gguf_blocks.cuh~s/return d \* \(float\)u \+ m;/return d * (float)u - m;/~ops:*Gemv*"
  "gguf_blocks.q5_k-high-fifth-bit-of-the-low-value~kernels/gguf_blocks.cuh~s/\(\(h >> \(2 \* g \+ 1\)\) & 1u\)/((h >> (2 * g)) \& 1u)/~ops:*Gemv*"
  "gguf_blocks.q3_k-high-bit-of-the-other-run~kernels/gguf_blocks.cuh~s/\(\(m >> \(4 \* h \+ j \+ 1\)\) & 1u\)/((m >> (4 * h + j)) \& 1u)/~ops:*Gemv*"
  "gguf_blocks.q3_k-run-b-scale~kernels/gguf_blocks.cuh~s/gemvq_k3_scale\(blk \+ 96, k \+ 2\)/gemvq_k3_scale(blk + 96, k + 1)/~ops:*Gemv*"
  "gguf_blocks.q3_k-scale-high-bits-transposed~kernels/gguf_blocks.cuh~s/\(s\[8 \+ \(k & 3\)\] >> \(2 \* \(k >> 2\)\)\)/(s[8 + (k >> 2)] >> (2 * (k \& 3)))/~ops:*Gemv*"
  "gguf_blocks.q6_k-high-run-scale~kernels/gguf_blocks.cuh~s/db = d \* \(float\)sc\[4\]/db = d * (float)sc[2]/~ops:*Gemv*"
  "gguf_blocks.q6_k-high-run-qh-bits~kernels/gguf_blocks.cuh~s/\(\(hb >> \(2 \* s \+ 4\)\) & 3u\)/((hb >> (2 * s + 2)) \& 3u)/~ops:*Gemv*"
  "gguf_blocks.q6_k-high-run-position~kernels/gguf_blocks.cuh~s/kb = ka \+ 64;/kb = ka + 32;/~ops:*Gemv*"
  "gguf_blocks.iq4-value-table~kernels/gguf_blocks.cuh~s/0x7159453526190d01ull/0x7159453526190c01ull/~ops:*Gemv*"
  "gguf_blocks.iq4_xs-scale-high-bits~kernels/gguf_blocks.cuh~s/\(\(h >> \(2 \* ib\)\) & 3u\) << 4\) - 32;/((h >> ib) \& 3u) << 4) - 32;/~ops:*Gemv*"
  "gguf_blocks.iq4_xs-high-run-position~kernels/gguf_blocks.cuh~s/kb = ka \+ 16;/kb = ka + 8;/~ops:*Gemv*"
  "gguf_blocks.part32-high-nibble-as-low~kernels/gguf_blocks.cuh~s/wb\[i\] = F::weight\(\(byte >> 4\)/wb[i] = F::weight((byte \& 0x0fu)/~ops:*Gemv*"
  "gguf_blocks.q5_0-offset~kernels/gguf_blocks.cuh~s/return d \* \(float\)\(\(int\)u - 16\);/return d * (float)((int)u - 15);/~ops:*Gemv*"
  "gguf_blocks.planes-run-b-start~kernels/gguf_blocks.cuh~s/  kb = ka \+ 32;\n  return x;/  kb = ka + 16;\n  return x;/~ops:*Gemv*"
  "gguf_blocks.planes-group-of-run-a~kernels/gguf_blocks.cuh~s/x\.g = 8 \* x\.h \+ 2 \* x\.j \+ \(x\.l0 >> 4\);/x.g = 8 * x.h + 2 * x.j + (x.l0 >> 3);/~ops:*Gemv*"
  "gguf_blocks.q2_k-run-b-group~kernels/gguf_blocks.cuh~s/const float db = d \* \(float\)\(blk\[g \+ 2\] & 0x0f\), mb = dmin \* \(float\)\(blk\[g \+ 2\] >> 4\);/const float db = d * (float)(blk[g + 1] \& 0x0f), mb = dmin * (float)(blk[g + 1] >> 4);/~ops:*Gemv*"
  "gguf_blocks.q2_k-min-added~kernels/gguf_blocks.cuh~s/wa\[i\] = da \* \(float\)\(\(byte >> \(2 \* j\)\) & 3u\) - ma;/wa[i] = da * (float)((byte >> (2 * j)) \& 3u) + ma;/~ops:*Gemv*"
  "gguf_blocks.format-list-drops-q6_k~kernels/gguf_blocks.cuh~s/ X\(GGML_Q6_K\)//~ops:*GemvErrors*"
  "gemv_q_multi.wrong-weight-index~kernels/gemv_q_set.cu~s/gemvq_set_dot<R>\(acc, set, m, x, o, in_dim, lane\);/gemvq_set_dot<R>(acc, set, m == 2 ? 1 : m, x, o, in_dim, lane);/~ops:*GemvQSet*"
  "gemv_q_swiglu.up-reads-gate~kernels/gemv_q_set.cu~s/gemvq_set_dot<R>\(u, set, 1, x, o, in_dim, lane\);/gemvq_set_dot<R>(u, set, 0, x, o, in_dim, lane);/~ops:*GemvQSet*"
  "gemv_q_set.bf16-vector-choice~kernels/gemv_q_set.cu~s/if \(type == GGML_BF16\) S.vec\[i\] = in_dim % 8 == 0/if (type == GGML_BF16) S.vec[i] = in_dim % 8 != 0/~ops:*GemvQSet*"
  "rmsnorm.lowp-truncates~kernels/rmsnorm.cu~s/lowp\[off \+ c\] = mk_dev_f32_to_bf16\(v\);/lowp[off + c] = (uint16_t)(__float_as_uint(v) >> 16);/~ops:*RmsNormLowp*"
  "cuda.lowp-ready-ignored~host/backend/cuda/backend_cuda.c~s/    if \(!x->ready\) \{/    if (0) {/~backend:*LowPrecisionInput*"
  "cuda.lowp-always-converted~host/backend/cuda/backend_cuda.c~s/    if \(!x->ready\) \{/    if (1) {/~backend:*LowPrecisionInput*:*PrefillNorms*"
  "cuda.lowp-missing-accepted~host/backend/cuda/backend_cuda.c~s/    if \(!x->lowp\)\n/    if (0)\n/~backend:*LowPrecisionInput*"
  "cuda.gemm-input-f32-for-prefill~host/backend/cuda/backend_cuda.c~s/    if \(rows <= MK_GEMV_MAX_ROWS\) return MK_DTYPE_F32;/    if (rows <= 64) return MK_DTYPE_F32;/~backend:*LowPrecisionInput*:*PrefillNorms*"
  "range.norm-writes-no-lowp~host/range/forward.c~s/ops->rmsnorm\(b, a->xn, lowp, a->x,/ops->rmsnorm(b, a->xn, NULL, a->x,/~backend:*TensorCorePrefill*:*NativeWeights*:*PrefillNorms*"
  "range.down-input-taken-as-ready~host/range/forward.c~s/mk_product\(r, p, a->proj, a->gate, false, &w->w_down\)/mk_product(r, p, a->proj, a->gate, true, \&w->w_down)/~backend:*TensorCorePrefill*:*NativeWeights*"
  "native.weight-tile-short~host/backend/cpu/cpu_native.c~s/: o0 \+ MK_WEIGHT_TILE;/: o0 + MK_WEIGHT_TILE - 1;/~native:*"
  "native.k-group-rows-from-group-start~host/backend/cpu/cpu_native.c~s/xk\[k\] = j->ctx->xk \+ \(r \+ k\) \* k_per_row/xk[k] = j->ctx->xk + r * k_per_row/~native:*BatchRows*"
  "native.k-rows-quantized-for-the-last-part-only~host/backend/cpu/cpu_native.c~s/j->k_blocks = j->k_blocks \|\| p->kdot \|\| p->kdotn;/j->k_blocks = p->kdot || p->kdotn;/~native:*SharedAndSwiglu*"
  "native.k-one-row-dots-read-row-zero~host/backend/cpu/cpu_native.c~s/p->kdot\(wr, j->ctx->xk \+ r \* k_per_row, in\)/p->kdot(wr, j->ctx->xk, in)/~native:*"
  "cpu_native.format-as-f32~host/backend/cpu/cpu_native.c~s/return w->format != MK_GGML_TYPE_F32 && /return /~native:*"
  "cpu.native-embed-row-stride~host/backend/cpu/cpu_native.c~s/data \+ \(size_t\)ids\[i\] \* row_bytes, row_bytes/data + (size_t)ids[i] * row_bytes + (ids[i] ? 2 : 0), row_bytes/~native:NativeWeightStore.*"
  "cpu.embed-width-from-rows~host/backend/cpu/backend_cpu.c~s/mk_cpu_embed\(out, table->data, ids, n, table->cols\);/mk_cpu_embed(out, table->data, ids, n, table->rows);/~host"
  "cuda.kv-read-misses-new-rows~host/backend/cuda/backend_cuda.c~s/2 \* \(past \+ rows\) \* n_kv_heads/2 * past * n_kv_heads/~backend:*ReadsEachWeight*:*NativeDecodeToken*"
  "cuda.native-set-bytes-last-only~host/backend/cuda/backend_cuda.c~s/\*bytes \+= w\[i\]->rows \* mk_cuda_row_bytes\(w\[i\]\);/*bytes = w[i]->rows * mk_cuda_row_bytes(w[i]);/~backend:*NativeDecodeToken*"
  # Stream races: one upload moved to the legacy default stream, which does not order against
  # the non-blocking stream the kernels run on; cudasim runs unordered streams' work in a
  # random interleaving, so the kernels read the buffer before (or without) the upload.
  "race.op-grid-upload-on-legacy~tests/ops/test_ops.cpp~s/cudaMemcpyAsync\(base_, h.data\(\), h.size\(\), cudaMemcpyHostToDevice, stream\)/cudaMemcpyAsync(base_, h.data(), h.size(), cudaMemcpyHostToDevice, 0)/~ops:*RmsNorm*"
  "race.token-upload-on-legacy~host/backend/cuda/backend_cuda.c~s/cudaMemcpyAsync\(dst, stage, bytes, cudaMemcpyHostToDevice, cb->stream\)/cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, 0)/~backend:*ParityMode*"
  "race.peer-copy-unordered~host/backend/cuda/backend_cuda.c~s/    if \(e == cudaSuccess\) e = cudaStreamWaitEvent\(cb->stream, pb->seam_event, 0\);\n//~backend:*HeadOnDeviceZero*"
  "graph.rope-kv-slot-from-host-past~host/backend/cuda/backend_cuda.c~s/\(void\)past; \/\*[^\n]*\*\//if (rows == 1) MK_TRY(mk_cuda_after_launch(cb, mk_kernel_kv_append(k_cache, v_cache, k, v, past, rows, n_kv_heads * head_dim, cb->stream)));/~backend:*DecodeGraph*"
  "graph.decode-keys-from-launch-arg~host/backend/cuda/backend_cuda.c~s/positions, rows, cb->max_context,/positions, rows, past + 1,/~backend:*DecodeGraph*"
  "graph.bucket-index-collides~host/range/forward.c~s/while \(\(\(size_t\)1 << i\) < rows\) i\+\+;/while (((size_t)1 << i) < rows \&\& i < 1) i++;/~gtest:test_batch_forward:BatchForwardCuda.*"
  "bundle.clear-error-removed~host/protocol/bundle.c~s/(mk_status mk_bundle_unpack\([^{]*\{\n)    mk_clear_error\(\);\n/\$1/~api"
  # ---- seams (host/seam/), each caught by the unit suite of its file -------------------
  "frame.align-hint-64-accepted~host/seam/frame.c~s/flags >= MK_FRAME_ALIGN/flags > MK_FRAME_ALIGN/~seams:FrameHeader.*"
  "frame.length-at-limit-refused~host/seam/frame.c~s/if \(\*length > limit\)/if (*length >= limit)/~seams:FrameHeader.*"
  "frame.empty-body-accepted~host/seam/frame.c~s/if \(\*length == 0\) return[^;]*;//~seams:FrameHeader.*"
  "frame.version-low-byte-only~host/seam/frame.c~s/version = mk_get_le\(in \+ 4, 2\)/version = mk_get_le(in + 4, 1)/~seams:FrameHeader.*"
  "frame.varint-overflow-unchecked~host/protocol/bundle_codec.c~s/if \(shift == 63 && b > 1\) return[^;]*;//~seams:FrameView.*"
  "frame.length-one-past-the-end~host/protocol/bundle_codec.c~s/if \(n > \(uint64_t\)\(c->end - c->p\)\)/if (n > (uint64_t)(c->end - c->p) + 1)/~seams:FrameView.*"
  "frame.fixed32-three-bytes~host/protocol/bundle_codec.c~s/c->end - c->p < 4\)/c->end - c->p < 3)/~seams:FrameView.*"
  "frame.wire-type-any-varint~host/protocol/bundle_codec.c~s/return wire_type == wanted \? MK_OK/return wire_type == wanted || wanted == 0 ? MK_OK/~seams:FrameView.*"
  "frame.ninth-dimension-stored~host/protocol/bundle_codec.c~s/if \(t->n_shape < MK_VIEW_RANK\) shape/if (t->n_shape <= MK_VIEW_RANK) shape/~seams:FrameView.*"
  "frame.positions-last-row-unchecked~host/protocol/bundle_codec.c~s/for \(size_t i = 0; i < rows; i\+\+\) \{/for (size_t i = 0; i + 1 < rows; i++) {/~seams:FrameBody.*"
  "frame.positions-from-zero~host/protocol/bundle_codec.c~s/\(int64_t\)p != first \+ \(int64_t\)i/(int64_t)p != (int64_t)i/~seams:FrameBody.*"
  "io.partial-write-restarts~host/net/io.c~s/put \+= \(size_t\)w;/put = (size_t)w;/~seams:SeamIo.*"
  "io.partial-read-restarts~host/net/io.c~s/got \+= \(size_t\)r;/got = (size_t)r;/~seams:SeamIo.*"
  "io.tls-partial-restarts~host/net/io.c~s/done \+= moved;/done = moved;/~seams:SeamTlsIo.*"
  "io.write-now-waits~host/net/io.c~s/if \(no_wait\) return MK_OK;\n(\s+)MK_TRY\(mk_wait_fd\(io->fd, POLLOUT/MK_TRY(mk_wait_fd(io->fd, POLLOUT/~seams:SeamIo.*"
  "io.read-now-waits~host/net/io.c~s/if \(no_wait\) return MK_OK;\n(\s+)MK_TRY\(mk_wait_fd\(io->fd, POLLIN/MK_TRY(mk_wait_fd(io->fd, POLLIN/~seams:SeamIo.*"
  "io.reset-is-an-io-error~host/net/io.c~s/\} else if \(errno == ECONNRESET\) \{/} else if (0) {/~seams:SeamIo.*"
  "io.epipe-is-an-io-error~host/net/io.c~s/errno == EPIPE \|\| errno == ECONNRESET/errno == ECONNRESET/~seams:SeamIo.*"
  "io.unix-path-one-too-long~host/net/io.c~s/strlen\(path\) >= sizeof sun->sun_path/strlen(path) > sizeof sun->sun_path/~seams:SeamSockets.*"
  "io.tls-failure-as-close~host/net/io.c~s/err == SSL_ERROR_ZERO_RETURN \|\| err == SSL_ERROR_SYSCALL \|\|\n                 \(err == SSL_ERROR_SSL && /err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL ||\n                 (err == SSL_ERROR_SSL || /~seams:SeamTlsIo.*"
  "io.connect-error-retried~host/net/io.c~s/if \(e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR\)/if (e != ECONNREFUSED \&\& e != ENOENT \&\& e != ENOTDIR \&\& e != EAGAIN \&\& e != EINTR)/~seams:SeamSockets.*"
  "io.zero-timeout-not-default~host/net/io.c~s/timeout_ms > 0 \? timeout_ms : default_ms/timeout_ms >= 0 ? timeout_ms : default_ms/~seams:SeamIo.*"
  "boundary.nan-scan-misses-last~host/protocol/bundle.c~s/mk_floats_nonfinite\(rows, h->rows \* h->hidden, &bad\)/mk_floats_nonfinite(rows, h->rows * h->hidden - 1, \&bad)/~seams:FaultyPeer.*:SeamApi.*"
  "boundary.nan-scan-first-row-only~host/protocol/bundle.c~s/mk_floats_nonfinite\(rows, h->rows \* h->hidden, &bad\)/mk_floats_nonfinite(rows, h->hidden, \&bad)/~seams:FaultyPeer.*"
  "stream.nan-scan-skipped~host/seam/stream.c~s/    MK_TRY\(mk_boundary_rows_finite\(st->rows\[k\], h\)\);\n//~seams:FaultyPeer.*"
  "stream.refused-body-breaks-stream~host/seam/stream.c~s/    return mk_bundle_decode_batch\(body, \(size_t\)len, h, cap, n, st->rows\);/    r = mk_bundle_decode_batch(body, (size_t)len, h, cap, n, st->rows);\n    return r == MK_OK ? r : mk_stream_break(st, r);/~seams:FaultyPeer.*"
  "stream.bad-header-keeps-stream~host/seam/stream.c~s/if \(r != MK_OK\) return mk_stream_break\(st, r\);/if (r != MK_OK) return r;/~seams:FaultyPeer.*"
  "stream.first-failure-forgotten~host/seam/stream.c~s/snprintf\(st->broken_error, sizeof st->broken_error, \"%s\", mk_last_error\(\)\);//~seams:FaultyPeer.*"
  "stream.rest-of-frame-from-start~host/seam/stream.c~s/st->job = frame \+ written;/st->job = frame;/~seams:SeamStream.*"
  "seam.empty-boundary-sent~host/seam/seam.c~s/if \(b\[k\]->h.rows == 0\) return[^;]*;//~seams:SeamApi.*"
  "seam.refused-payload-rows-kept~host/seam/seam.c~s/            into\[k\]->h.rows = 0;\n            if \(errors\)/            if (errors)/~seams:SeamApi.*"
  "seam.contract-skipped~host/seam/seam.c~s/mk_status e = contract\(user, k, &h\[k\], &seq\);/mk_status e = MK_OK;/~seams:FaultyPeer.*"
  "seam.stamp-on-failed-receive~host/seam/seam.c~s/        entry_status\[k\] = e;\n/        entry_status[k] = e;\n        seam_stamp(into[k], seq);\n/~gtest:test_step_allocs:StepAllocs.*"
  "range.stamp-ignores-length~host/range/forward.c~s/ && in->checked_length == seq->length;/;/~gtest:test_step_allocs:StepAllocs.*"
  "pipeline.step-allocates~host/pipeline/pipeline.c~s/size_t \*lengths = p->step_lengths;/size_t *lengths = malloc(p->n_ranges * sizeof *lengths);/~gtest:test_step_allocs:StepAllocs.*"
  "range.decode-step-allocates~host/range/forward.c~s/int32_t \*positions = r->host_positions;/int32_t *positions = malloc(rows * sizeof *positions);/~gtest:test_step_allocs:StepAllocs.*"
  "seam.recv-on-sending-end~host/seam/seam.c~s/if \(s->sender\) return mk_fail\(MK_ERR_INVALID_ARGUMENT, \"mk_seam_recv: this is a sending end\"\);//~seams:SeamApi.*"
  "seam.default-io-timeout~host/seam/seam.c~s/o.io_timeout_ms = 30000;/o.io_timeout_ms = 3000;/~seams:SeamApi.*"
  "seam.listener-file-left~host/seam/seam.c~s/\(void\)unlink\(l->address\);//~seams:SeamApi.*"
  "tls.sender-without-certificate~host/net/tls.c~s/SSL_VERIFY_PEER \| SSL_VERIFY_FAIL_IF_NO_PEER_CERT/SSL_VERIFY_PEER/~seams:TlsPeer.*"
  "tls.tls12-allowed~host/net/tls.c~s/!SSL_CTX_set_min_proto_version\(ctx, TLS1_3_VERSION\) \|\| //~seams:TlsPeer.*"
  "tls.psk-31-bytes-accepted~host/net/tls.c~s/n \/ 2 < MK_PSK_MIN/n \/ 2 < MK_PSK_MIN - 1/~seams:SeamTlsContext.*"
  "tls.psk-65-bytes-accepted~host/net/tls.c~s/n \/ 2 > MK_PSK_MAX/n \/ 2 > MK_PSK_MAX + 1/~seams:SeamTlsContext.*"
  "tls.psk-second-digit-unchecked~host/net/tls.c~s/ \|\|\n            !strchr\(\"0123456789abcdefABCDEF\", hex\[2 \* i \+ 1\]\)//~seams:SeamTlsContext.*"
  "tls.psk-identity-ignored~host/net/tls.c~s/identity_len != strlen\(psk->identity\) \|\| memcmp\(identity, psk->identity, identity_len\) != 0/0/~seams:TlsPeer.*"
  "tls.ca-not-loaded~host/net/tls.c~s/SSL_CTX_load_verify_locations\(ctx, tls->ca_file, NULL\) != 1/0/~seams:TlsPeer.*"
  "local.posted-kept~host/seam/local.c~s/    link->n_posted = 0; \/\* each send is received once \*\/\n//~seams:SeamLocal.*"
  "local.bytes-uncounted~host/seam/local.c~s/    s->bytes \+= bytes;\n//~seams:SeamLocal.*"
  "local.copy-one-row-short~host/seam/local.c~s/const size_t bytes = from->h.rows \* /const size_t bytes = (from->h.rows - 1) * /~seams:SeamLocal.*"
  "wire.nan-scan-skipped~host/seam/wire.c~s/    MK_TRY\(mk_boundary_rows_finite\(link->rows\[k\], &into->h\)\);\n//~seams:SeamApi.*"
  "wire.sent-kept~host/seam/wire.c~s/    link->sent = false;\n//~seams:SeamApi.*"
  "wire.bytes-uncounted~host/seam/wire.c~s/    s->bytes \+= link->len;\n//~seams:SeamApi.*"
  "nccl_absent.publish-succeeds~host/seam/nccl_absent.c~s/\(void\)id_path;\n    return mk_no_nccl\(\);/(void)id_path;\n    return MK_OK;/~seams:SeamApi.*"
  "nccl_absent.join-succeeds~host/seam/nccl_absent.c~s/\(void\)s;\n    \(void\)id_path;\n    return mk_no_nccl\(\);/(void)s;\n    (void)id_path;\n    return MK_OK;/~seams:SeamApi.*"
  "nccl_absent.id-new-succeeds~host/seam/nccl_absent.c~s/\(void\)cap;\n    return mk_no_nccl\(\);/(void)cap;\n    return MK_OK;/~seams:SeamApi.*"
  "nccl.contract-refusal-keeps-comm~host/seam/nccl/nccl_comm.c~s/            if \(ctx->comm\) ncclCommAbort\(ctx->comm\);\n            ctx->comm = NULL;\n            ctx->send_pending = 0;\n            return st;/            return st;/~nccl:NcclSeam*"
  "nccl.refusal-keeps-comm~host/seam/nccl/nccl_comm.c~s/    if \(ctx->comm\) \{\n        ncclCommAbort\(ctx->comm\);\n        ctx->comm = NULL;\n    \}\n    ctx->send_pending = 0;/    ctx->send_pending = 0;/~nccl:NcclSeamRules.*"
  "nccl.payload-one-byte-over~host/seam/nccl/nccl_comm.c~s/if \(pb > payload_cap\)/if (pb > payload_cap + 1)/~nccl:NcclSeamRules.*"
  "nccl.header-over-receiver-cap~host/seam/nccl/nccl_comm.c~s/if \(hb > MK_NCCL_HEADER_MAX \|\| hb > header_cap\)/if (hb > MK_NCCL_HEADER_MAX)/~nccl:NcclSeamRules.*"
  "nccl.envelope-version-unchecked~host/seam/nccl/nccl_comm.c~s/magic != MK_NCCL_MAGIC \|\| version != MK_NCCL_VERSION/magic != MK_NCCL_MAGIC/~nccl:NcclSeamRules.*"
  "nccl.warmup-block-unchecked~host/seam/nccl/nccl_comm.c~s/if \(recv_from >= 0 && get_le\(ctx->recv_block_host, 4\) != MK_NCCL_MAGIC\)/if (0)/~nccl:NcclSeamRules.*"
  "nccl.send-header-max-plus-one~host/seam/nccl/nccl_comm.c~s/header_bytes > MK_NCCL_HEADER_MAX \|\|/header_bytes > MK_NCCL_HEADER_MAX + 1 ||/~nccl:NcclSeamRules.*"
  "nccl_boot.id-file-world-readable~host/seam/nccl/nccl_bootstrap.c~s/O_WRONLY \| O_CREAT \| O_TRUNC \| O_CLOEXEC, 0600/O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644/~nccl:NcclBootstrap.*"
  "nccl_boot.magic-unchecked~host/seam/nccl/nccl_bootstrap.c~s/if \(memcmp\(rec, id_magic, sizeof id_magic\) != 0\)/if (0)/~nccl:NcclBootstrap.*"
  "nccl_boot.short-file-accepted~host/seam/nccl/nccl_bootstrap.c~s/if \(r != \(ssize_t\)sizeof rec\)/if (r < (ssize_t)sizeof id_magic)/~nccl:NcclBootstrap.*"
  "nccl_boot.cut-record-a-timeout~host/seam/nccl/nccl_bootstrap.c~s/return mk_fail\(MK_ERR_PEER_CLOSED, \"nccl bootstrap: the server closed/return mk_fail(MK_ERR_PEER_TIMEOUT, \"nccl bootstrap: the server closed/~nccl:NcclBootstrap.*"
  "nccl_seam.header-tag-unchecked~host/seam/nccl/nccl_seam.c~s/if \(v != MK_NCCL_HEADER_TAG\) return[^;]*;//~nccl:NcclHeader.*"
  "nccl_seam.header-tag-three-bytes~host/seam/nccl/nccl_seam.c~s/if \(v != MK_NCCL_HEADER_TAG\)/if ((v \& 0xffffffu) != (MK_NCCL_HEADER_TAG \& 0xffffffu))/~nccl:NcclHeader.*"
  "nccl_seam.string-unterminated~host/seam/nccl/nccl_seam.c~s/if \(memchr\(p, 0, field\) == NULL\) \*ok = false;//~nccl:NcclHeader.*"
  "nccl_seam.encode-fills-field~host/seam/nccl/nccl_seam.c~s/memcpy\(p, s, strnlen\(s, field - 1\)\);/memcpy(p, s, strnlen(s, field));/~nccl:NcclHeader.*"
  "nccl_seam.longer-payload-accepted~host/seam/nccl/nccl_seam.c~s/if \(payload_bytes != want\)/if (payload_bytes < want)/~ncclpipe:NcclSeamFaults.*"
  "nccl_seam.payload-size-unchecked~host/seam/nccl/nccl_seam.c~s/if \(payload_bytes != want\)/if (0)/~ncclpipe:NcclSeamFaults.*"
  "nccl.init-refusal-as-frame~host/seam/nccl/nccl_comm.c~s/return fail_abort\(ctx, nccl_status\(a, 0\),\n(\s+)\"NCCL refused/return fail_abort(ctx, nccl_status(a, 1),\n\$1\"NCCL refused/~nccl:NcclSeam.CommunicatorRefusedAtInit*"
  "range.graph-failure-not-kept~host/range/forward.c~s/snprintf\(r->graph_failure, [^;]*;//~backend:*CaptureFailure*"
  # ---- stage runtime parts (host/stage/control.c, slots.c): the unit suite ---------------
  "control.receiver-limit-plus-one~host/stage/control.c~s/if \(n > MK_CTL_MAX_BODY\)\n/if (n > MK_CTL_MAX_BODY + 1)\n/~stageunits:StageControl.*"
  "control.sender-limit-plus-one~host/stage/control.c~s/if \(len > MK_CTL_MAX_BODY\) return/if (len > MK_CTL_MAX_BODY + 1) return/~stageunits:StageControl.*"
  "control.type-past-the-last~host/stage/control.c~s/t > MK_CTL_LAST/t > MK_CTL_LAST + 1/~stageunits:StageControl.*"
  "control.type-zero-accepted~host/stage/control.c~s/t < MK_CTL_HELLO \|\| //~stageunits:StageControl.*"
  "control.close-not-peer-lost~host/stage/control.c~s/    if \(s == MK_ERR_PEER_CLOSED\) return mk_stage_wrap\(MK_ERR_PEER_LOST, \"%s closed its connection\", peer\);\n    if \(s == MK_ERR_PEER_TIMEOUT\)/    if (s == MK_ERR_PEER_TIMEOUT)/~stageunits:StageControl.*"
  "control.abort-status-unknown-accepted~host/stage/control.c~s/if \(strcmp\(mk_status_name\(\(mk_status\)v\), \"MK_ERR_UNKNOWN\"\) == 0\)/if (0)/~stageunits:StageControl.*"
  "control.abort-status-zero~host/stage/control.c~s/v <= 0 \|\| v > 1000/v < 0 || v > 1000/~stageunits:StageControl.*"
  "control.unknown-abort-status-passed~host/stage/control.c~s/if \(strcmp\(mk_status_name\(\(mk_status\)v\), \"MK_ERR_UNKNOWN\"\) == 0\)/if (0)/~stageunits:StageControl.*"
  "control.abort-without-reason-empty~host/stage/control.c~s/if \(!\*why\)/if (0)/~stage:StageMessages.*"
  "slots.id-one-too-long~host/stage/slots.c~s/strlen\(id\) >= sizeof t->slot\[0\].request_id/strlen(id) > sizeof t->slot[0].request_id/~stageunits:StageSlots.*"
  "slots.release-keeps-cache~host/stage/slots.c~s/    \(void\)mk_sequence_reset\(s->seq\);[^\n]*\n//~stageunits:StageSlots.*"
  "slots.release-ignored~host/stage/slots.c~s/\n    s->request_id\[0\] = [^;]*;//~stageunits:StageSlots.*"
  "slots.free-slot-ignored~host/stage/slots.c~s/if \(!t->slot\[i\].request_id\[0\]\) s = &t->slot\[i\];/(void)0;/~stageunits:StageSlots.*"
  "slots.empty-table-accepted~host/stage/slots.c~s/if \(n == 0\) return mk_fail[^;]*;//~stageunits:StageSlots.*"
  # Generation (host/generate.c): which tokens end it, the budget, the callback's status.
  "gen.eos-only-ends~host/pipeline/generate.c~s/if \(mk_tokenizer_is_eog\(tok, next\)\)/if (tok \&\& next == mk_tokenizer_eos(tok))/~gen:GenerateRules.*"
  "gen.callback-status-dropped~host/pipeline/generate.c~s/if \(callback\) s = callback/if (callback) (void)callback/~gen:GenerateRules.*"
  "gen.budget-one-more~host/pipeline/generate.c~s/st.n_generated < max_new; step\+\+/st.n_generated <= max_new; step++/~gen:GenerateRules.*"
  "gen.end-token-passed-on~host/pipeline/generate.c~s/st.stopped_at_eog = true;/st.stopped_at_eog = true;\n            if (callback) (void)callback(user, next, out->logits, out->vocab);/~gen:GenerateRules.*"
  "gen.decode-overflow-blamed-on-prompt~host/pipeline/generate.c~s/if \(step == 0 && s == MK_ERR_CONTEXT_OVERFLOW\)/if (s == MK_ERR_CONTEXT_OVERFLOW)/~gen:GenerateRules.*"
  # The tokenizer files: UTF-8, the end-of-generation set, loading refusals, the special split.
  "tok.utf8-last-surrogate~host/text/tokenizer.c~s/\(cp >= 0xd800 && cp <= 0xdfff\)/(cp >= 0xd800 \&\& cp < 0xdfff)/~text:Utf8.*"
  "tok.utf8-overlong-3~host/text/tokenizer.c~s/\(n == 3 && cp < 0x800\)/(n == 3 \&\& cp < 0x7ff)/~text:Utf8.*"
  "tok.utf8-past-10ffff~host/text/tokenizer.c~s/cp > 0x10ffff\)/cp > 0x110000)/~text:Utf8.*"
  "tok.eog-named-ids-skip-eom~host/text/tokenizer.c~s/for \(size_t k = 0; k < 3; k\+\+\)/for (size_t k = 0; k < 2; k++)/~text:TokenizerLoad.*"
  "tok.eog-texts-skip-last~host/text/tokenizer.c~s/k < sizeof mk_eog_texts \/ sizeof mk_eog_texts\[0\]/k + 1 < sizeof mk_eog_texts \/ sizeof mk_eog_texts[0]/~text:TokenizerLoad.*"
  "tok.id-key-one-past~host/text/tokenizer.c~s/return v < n_vocab \? \(int32_t\)v : fallback;/return v <= n_vocab ? (int32_t)v : fallback;/~text:TokenizerLoad.*"
  "tok.eog-user-defined-made-control~host/text/tokenizer.c~s/ && t->type\[id\] != MK_TOKEN_USER_DEFINED\)/)/~text:TokenizerLoad.*"
  "tok.token-type-one-short~host/text/tokenizer.c~s/(\"tokenizer.ggml.token_type\", &data, &count\) != MK_OK \|\| count) < n\)/\$1 + 1 < n)/~text:TokenizerLoad.*"
  "tok.add-eos-without-eos~host/text/tokenizer.c~s/if \(t->add_eos && t->eos < 0\)/if (0 \&\& t->add_eos \&\& t->eos < 0)/~text:TokenizerLoad.*"
  "tok.llama-v3-no-bos~host/text/tokenizer.c~s/\{\"llama-v3\", MK_PRE_LLAMA3, true, true\}/{\"llama-v3\", MK_PRE_LLAMA3, false, false}/~text:TokenizerLoad.*"
  "tok.special-shortest-first~host/text/tokenizer.c~s/if \(la != lb\) return la > lb \? -1 : 1;/if (la != lb) return la > lb ? 1 : -1;/~text:TokenizerSpm.*"
  "tok.no-prefix-after-special~host/text/tokenizer.c~s/(s = mk_id_buf_push\(out, fr->token\);\n\s+prev_special =) true;/\$1 false;/~text:TokenizerSpm.*"
  "bpe.tie-rightmost~host/text/tokenizer_bpe.c~s/a->rank == b->rank && a->left < b->left/a->rank == b->rank \&\& a->left > b->left/~text:TokenizerLoad.*"
  "bpe.ignore-merges-dropped~host/text/tokenizer_bpe.c~s/if \(t->ignore_merges\) \{/if (0) {/~text:TokenizerLoad.*"
  "bpe.gap-dropped~host/text/tokenizer_bpe.c~s/            if \(s > gap\) MK_TRY\(mk_spans_push\(out, base \+ gap, s - gap\)\);\n//~text:TokenizerLoad.*"
  "bpe.symbol-bytes-dropped~host/text/tokenizer_bpe.c~s/if \(bid >= 0\) MK_TRY\(mk_id_buf_push\(out, bid\)\);/(void)bid;/~text:TokenizerLoad.*"
  "spm.lowest-score-first~host/text/tokenizer_spm.c~s/return a->score > b->score \|\|/return a->score < b->score ||/~text:TokenizerSpm.*"
  "spm.tie-rightmost~host/text/tokenizer_spm.c~s/a->score == b->score && a->left < b->left/a->score == b->score \&\& a->left > b->left/~text:TokenizerSpm.*"
  "spm.byte-tokens-skipped~host/text/tokenizer_spm.c~s/if \(b >= 0\) MK_TRY\(mk_id_buf_push\(out, b\)\);\n(\s+)else if/if (0) MK_TRY(mk_id_buf_push(out, b));\n\$1else if/~text:TokenizerSpm.*"
  "spm.space-not-escaped~host/text/tokenizer_spm.c~s/if \(c == ' '\) memcpy/if (0) memcpy/~text:TokenizerSpm.*"
  "spm.unk-id-zero-ignored~host/text/tokenizer_spm.c~s/else if \(t->unk >= 0\)/else if (t->unk > 0)/~text:TokenizerSpm.*"
  "detok.stream-strips-every-piece~host/text/detokenizer.c~s/(memmove\(raw, raw \+ 1, --m\);\n)\s+d->first = false;[^\n]*\n/\$1/~text:TokenizerStream.*"
  "detok.flush-keeps-state~host/text/detokenizer.c~s/    d->n_held = 0;\n    d->first = true;\n/    d->n_held = 0;\n/~text:TokenizerStream.*"
  "detok.surrogate-held~host/text/detokenizer.c~s/\(c == 0xed && s\[1\] > 0x9f\) \|\| //~text:TokenizerStream.*"
  "detok.overlong-4-held~host/text/detokenizer.c~s/\(c == 0xf0 && s\[1\] < 0x90\)/(c == 0xf0 \&\& s[1] < 0x8f)/~text:TokenizerStream.*"
  "detok.user-defined-hidden~host/text/detokenizer.c~s/if \(type != MK_TOKEN_USER_DEFINED && !\(flags & MK_DECODE_SPECIAL\)\) return;/if (!(flags \& MK_DECODE_SPECIAL)) return;/~text:TokenizerDecode.*"
  "detok.decode-strips-every-piece~host/text/detokenizer.c~s/            first = false; \/\* only the first non-empty piece carries the prefix \*\/\n//~text:TokenizerSpm.*"
  "detok.decode-id-one-past~host/text/detokenizer.c~s/if \(ids\[i\] < 0 \|\| \(size_t\)ids\[i\] >= t->n_vocab\)/if (ids[i] < 0 || (size_t)ids[i] > t->n_vocab)/~text:TokenizerDecode.*"
  "tokenizer.control-token-found-inside-content~host/text/tokenizer.c~s/if \(anywhere \|\| !mk_in_literal\(lit, n_lit, at, nlen\)\) return hit;/return hit;/~text:*ChatTemplate*"
  "chat_template.content-span-not-recorded~host/text/chat_template.c~s/b->content\[b->n_content\+\+\] = \(mk_text_span\)\{start, b->n\};/(void)start;/~text:*ChatTemplate*"
  "chat_template.tail-span-not-shifted~host/text/chat_template.c~s/tail\[k\+\+\] = \(mk_text_span\)\{\(spans\[i\]\.start > from \? spans\[i\]\.start : from\) - from, spans\[i\]\.end - from\};/tail[k++] = spans[i];/~text:*ChatTemplate*"
  "chat_template.tail-span-start-unclipped~host/text/chat_template.c~s/\(spans\[i\]\.start > from \? spans\[i\]\.start : from\) - from/spans[i].start - from/~text:*ChatTemplate*"
  "tokenizer.literal-span-overlap-misread~host/text/tokenizer.c~s/if \(lit\[i\]\.end > at\) return true;/if (lit[i].start >= at) return true;/~text:*ChatTemplate*"
  # Decode graphs: what a recorded step bakes in (range.c) and the step ops (backend_cuda.c),
  # counted by mk_backend_counters.graph_captures and cudasim's live graphs.
  "graph.step-input-not-copied~host/range/forward.c~s/    if \(in\) MK_TRY\(b->ops->copy\(b, a->x, in, residual_bytes\)\);\n    MK_TRY\(mk_forward_bucket/    MK_TRY(mk_forward_bucket/~backend:*DecodeGraph*:*DecodeStep*"
  "graph.step-output-not-copied~host/range/forward.c~s/    if \(out\) MK_TRY\(b->ops->copy\(b, out, a->x, residual_bytes\)\);\n    return MK_OK;\n\}/    return MK_OK;\n}/~backend:*DecodeGraph*:*DecodeStep*"
  "graph.step-not-kept~host/range/forward.c~s/        r->steps\[at\] = step;\n//~backend:*DecodeGraph*:*DecodeStep*"
  "graph.steps-leaked~host/range/range.c~s/            if \(r->steps\[i\]\) r->backend->ops->step_destroy\(r->backend, r->steps\[i\]\);/            (void)0;/~backend:*DecodeGraph*"
  "graph.retried-after-failed-capture~host/range/forward.c~s/r->graphs = false;\n(\s+)return mk_forward_device/return mk_forward_device/~backend:*DecodeGraph*:*DecodeStep*"
  "graph.recorded-while-profiling~host/range/forward.c~s/if \(rows == 1 && r->graphs && !r->profile.on\)/if (rows == 1 \&\& r->graphs)/~backend:*DecodeGraph*:*DecodeStep*"
  "cuda.capture-launches-counted~host/backend/cuda/backend_cuda.c~s/    cb->base.counters.launches = cb->capture_start.launches;\n//~backend:*DecodeGraph*:*DecodeStep*"
  "cuda.step-begin-twice~host/backend/cuda/backend_cuda.c~s/if \(cb->capturing\) return mk_fail/if (0 \&\& cb->capturing) return mk_fail/~backend:*DecodeGraph*:*DecodeStep*"
  "cuda.step-end-unbegun~host/backend/cuda/backend_cuda.c~s/if \(!cb->capturing\) return mk_fail/if (0 \&\& !cb->capturing) return mk_fail/~backend:*DecodeGraph*:*DecodeStep*"
  "cuda.step-exec-leaked~host/backend/cuda/backend_cuda.c~s/cudaGraphExecDestroy\(st->exec\);/(void)st;/~backend:*DecodeGraph*:*DecodeStep*"
  # The split chooser's cost (GQA), the scheduler's stop ids, the cpu GEMM row threshold.
  "split.gqa-kv-as-wide-as-q~host/sched/split_auto.c~s/kv_dim = \(double\)\(hp->n_kv_heads \* hp->head_dim\)/kv_dim = (double)(hp->n_heads * hp->head_dim)/~sched:SplitAuto.*"
  "sched.last-stop-id-ignored~host/sched/pipeline_sched.c~s/for \(size_t i = 0; i < r->n_stop; i\+\+\) stop/for (size_t i = 0; i + 1 < r->n_stop; i++) stop/~sched:*StopId*"
  "native.k-prefill-takes-the-tiles~host/backend/cpu/cpu_native.c~s/ \|\| mk_cpu_quant_kdotn_for\(ctx->kernels, format\);/;/~native:*Threshold*"
  "native.prefill-dots-even-without-n-row-dot~host/backend/cpu/cpu_native.c~s/!ctx->wtile \|\|\n\s*mk_native_has_rows_dot\(ctx, w->format\)/!ctx->wtile || w->format != MK_GGML_TYPE_F16/~native:*Threshold*"
  "native.gemm-from-one-more-row~host/backend/cpu/cpu_native.c~s/alone \|\| rows < MK_NATIVE_GEMM_MIN_ROWS \|\|/alone || rows <= MK_NATIVE_GEMM_MIN_ROWS ||/~native:*Threshold*:*SharedAndSwiglu*"
  # Issue 23: counts from outside, the rendezvous, messages through cleanup, busy ranks.
  "size.mul-unchecked~host/core/mk_size.h~s/if \(__builtin_mul_overflow\(a, b, out\)\)/if (0 \&\& __builtin_mul_overflow(a, b, out))/~gtest:test_checked_size:*"
  "gguf.k4-min-high-bits~host/model/gguf.h~s/\(\(c >> 4\) & low4\) \| \(\(b >> 6\) & low2\) << 4/((c >> 4) \& low4) | ((b >> 6) \& low2) << 3/~gtest:test_gguf_dequant:*"
  "gguf.k4-high-scale-bits-of-the-mins~host/model/gguf.h~s/\(c & low4\) \| \(\(a >> 6\) & low2\) << 4/(c \& low4) | ((b >> 6) \& low2) << 4/~gtest:test_gguf_dequant:*"
  "gguf.k4-scale-low-sub-blocks-from-mins~host/model/gguf.h~s/const uint32_t words\[4\] = \{a & low6,/const uint32_t words[4] = {b \& low6,/~gtest:test_gguf_dequant:*"
  "size.add-unchecked~host/core/mk_size.h~s/if \(__builtin_add_overflow\(a, b, out\)\)/if (0 \&\& __builtin_add_overflow(a, b, out))/~gtest:test_checked_size:*"
  "size.grow-double-unchecked~host/core/mk_size.h~s/if \(!mk_size_mul\(n, 2, &twice\)\)/if (!mk_size_mul(n, 2, \&twice) \&\& 0)/~gtest:test_checked_size:*"
  "size.grow-cap-kept~host/core/mk_size.h~s/    \*cap = n;\n    return MK_OK;/    return MK_OK;/~gtest:test_checked_size:*"
  "size.grow-once-not-until-need~host/core/mk_size.h~s/    while \(n < need\) \{/    if (n < need) {/~gtest:test_checked_size:*"
  "stage.token-buffer-not-capped~host/stage/stage_head.c~s/e->cap = limit < room \? limit : room;/e->cap = limit;/~stage:StageLibrary.*"
  "stage.live-cut-ignored~host/stage/stage_head.c~s/if \(stop \|\| cut \|\| e->n == e->cap\)/if (stop || e->n == e->cap)/~stage:StageLibrary.*"
  "stage.live-refusal-fails-the-run~host/stage/stage_head.c~s/if \(mk_head_refuse\(h, &a\)\) continue;/(void)0;/~stage:StageLibrary.*"
  "serve.over-cap-let-through~tools/serve.c~s/\*socket_context = open > srv->max_conn \?/*socket_context = open > srv->max_conn + 1 ?/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "stage.cancel-not-asked~host/stage/stage_head.c~s/if \(!h->src->cancelled\) return;/return;/~stage:StageLibrary.*"
  "stage.cancel-asked-mid-step~host/stage/stage_head.c~s/if \(e->used && e->ready && h->src->cancelled/if (e->used \&\& h->src->cancelled/~stage:StageLibrary.*"
  "stage.live-idle-without-beats~host/stage/stage_head.c~s/if \(idle\) mk_stage_busy\(st, true\);/(void)0;/~stage:StageLibrary.*"
  "stage.live-busy-not-counted~host/stage/stage_head.c~s/__atomic_fetch_add\(&st->live_busy_ns/__atomic_fetch_add(\&st->live_steps/~stage:StageLibrary.*"
  "stage.live-admits-past-the-slots~host/stage/stage_head.c~s/while \(!h->closed && h->in_flight < st->max_sequences\)/while (!h->closed \&\& h->in_flight <= st->max_sequences)/~stage:StageLibrary.*"
  "sched.prefill-chunk-ignored~host/range/range.h~s/return chunk && left > chunk \? chunk : left;/return left;/~sched:*ALongPrompt*"
  "sched.chunk-token-taken-as-the-answer~host/sched/pipeline_sched.c~s/if \(item->kind == MK_ITEM_PREFILL && item->prompt_done \+ item->n_tokens < r->n_prompt\) \{/if (0) {/~sched:*ChunkedPrefill*"
  "sched.chunk-not-advanced~host/sched/pipeline_sched.c~s/        item->prompt_done \+= item->n_tokens;\n//~sched:*ChunkedPrefill*"
  "sched.chunk-restarts-the-prompt~host/sched/pipeline_sched.c~s/item->tokens = r->prompt \+ item->prompt_done;/item->tokens = r->prompt;/~sched:*ChunkedPrefill*"
  "stage.prefill-chunk-ignored~host/range/range.h~s/return chunk && left > chunk \? chunk : left;/return left;/~stage:StageLibrary.ReadyRequestsShareRankZerosForward"
  "stage.chunk-token-taken-as-the-answer~host/stage/stage_head.c~s/if \(e->n == 0 && e->prompt_done \+ e->step_rows < e->a.n_prompt\) \{/if (0) {/~stage:StageLibrary.ReadyRequestsShareRankZerosForward"
  "stage.chunk-restarts-the-prompt~host/stage/stage_head.c~s/e->n == 0 \? e->prompt \+ e->prompt_done :/e->n == 0 ? e->prompt :/~stage:StageLibrary.ReadyRequestsShareRankZerosForward"
  "serve.cut-requests-not-awaited~tools/serve.c~s/until.tv_sec \+= MK_CUT_ANSWER_SECONDS;/until.tv_sec -= 1;/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.second-content-length-taken~tools/serve.c~s/if \(framing.content_length > 1 \|\| /if (/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.models-retrieve-any-id~tools/serve.c~s/    if \(strcmp\(id, srv->model_id\) != 0\) \{/    if (0) {/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.nul-escape-decoded~tools/serve.c~s/&& \(hi \| lo\)\) \{/) {/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.raw-nul-byte-passes~tools/serve_req.c~s/        if \(body\[i\] == '\\\\0'\) return i;/        (void)0;/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.error-body-bytes-unchecked~tools/serve_req.c~s/cJSON_AddStringToObject\(e, \x22message\x22, msg\);/cJSON_AddStringToObject(e, \x22message\x22, err->message);/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.chunked-beside-length-taken~tools/serve.c~s/ \|\| \(framing.content_length && framing.transfer_encoding\)//~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.nul-escape-let-through~tools/serve_req.c~s/if \(body\[i \+ 1\] == .u. && i \+ 6 <= len/if (body[i + 1] == 'U' \&\& i + 6 <= len/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.nul-scan-ignores-escaped-backslash~tools/serve_req.c~s/            i\+\+; \/\* the escaped character/            (void)0; \/* the escaped character/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.stage-cut-ignored~tools/serve.c~s/const bool gone = srv->closing \|\| !mk_job_of\(srv, tag\);/const bool gone = srv->closing;/~ctest:meshkern_serve.StageServeAndIPv6"
  "serve.ipv6-not-asked~tools/serve.c~s/flags \|= MHD_USE_IPv6;/(void)0;/~ctest:meshkern_serve.StageServeAndIPv6"
  "batch.attention-reads-first-sequence~host/range/forward.c~s/MK_TRY\(mk_run_attention\(r, &p->spans\[i\], layer_index\)\)/MK_TRY(mk_run_attention(r, \&(mk_span){p->spans[0].seq, p->spans[i].row0, p->spans[i].rows}, layer_index))/~gtest:test_batch_forward:*"
  "batch.decode-groups-ignore-rows-alone~host/range/forward.c~s/mk_groups_alone\(groups, &n_groups, decode_rows, r->rows_alone\)/mk_groups_alone(groups, \&n_groups, decode_rows, decode_rows)/~gtest:test_batch_forward:*"
  "batch.decode-group-size-ignored~host/range/forward.c~s/rows - g0 < cap \? rows - g0 : cap/rows - g0/~gtest:test_batch_forward:*"
  "batch.tail-samples-first-row~host/range/forward.c~s/const size_t last = p->spans\[i\].row0 \+ p->spans\[i\].rows - 1;/const size_t last = p->spans[i].rows - 1;/~gtest:test_batch_forward:*"
  "batch.positions-not-per-entry~host/range/forward.c~s/r->host_positions\[spans\[i\].row0 \+ k\] = \(int32_t\)\(spans\[i\].seq->length \+ k\)/r->host_positions[spans[i].row0 + k] = (int32_t)k/~gtest:test_batch_forward:*"
  "batch.duplicate-sequence-accepted~host/range/forward.c~s/if \(entries\[j\].seq == entries\[i\].seq\)/if (0)/~gtest:test_batch_forward:*"
  "batch.entry-unchecked~host/range/forward.c~s/MK_TRY\(mk_batch_entry_check\(r, &entries\[i\], i, &rows\)\);/rows = entries[i].in ? entries[i].in->h.rows : entries[i].n_tokens;/~gtest:test_batch_forward:*"
  "batch.lowp-offset-ignored~host/range/forward.c~s/lowp \? \(uint8_t \*\)lowp \+ g->row0 \* w->cols \* es : NULL/lowp/~gtest:test_batch_forward:*"
  "sched.batch-takes-stop-item~host/sched/worker.c~s/if \(item->kind == MK_ITEM_STOP \|\| room->rows/if (room->rows/~gtest:test_pipeline_sched:PipelineQueue.*"
  "sched.batch-never-forms~host/sched/worker.c~s/if \(n == st->max_batch \|\| !\(item/if (1 || !(item/~gtest:test_pipeline_sched:*Batched*"
  "sched.batch-input-boundary-shared~host/sched/worker.c~s/s = mk_worker_prepare\(st, item, head \? NULL : st->ins\[n\]\);/s = mk_worker_prepare(st, item, head ? NULL : st->ins[0]);/~gtest:test_pipeline_sched:*Batched*"
  "stage.head-one-request-per-step~host/stage/stage_head.c~s/k < st->max_sequences && n < st->max_batch;/k < st->max_sequences \&\& n < 1;/~stage:StageLibrary.*"
  "stage.member-batch-reads-first-boundary~host/stage/stage_member.c~s/entries\[n\] = \(mk_forward_entry\)\{.seq = r->seq, .in = st->ins\[k\]/entries[n] = (mk_forward_entry){.seq = r->seq, .in = st->ins[0]/~stage"
  "stage.head-decode-feeds-first-token~host/stage/stage_head.c~s/\.token_ids = e->n == 0 \? e->prompt \+ e->prompt_done : &e->tokens\[e->n - 1\]/.token_ids = e->n == 0 ? e->prompt + e->prompt_done : \&e->tokens[0]/~stage:StageLibrary.*"
  "sched.token-buffer-not-capped~host/sched/pipeline_sched.c~s/const size_t n_max = max_new < mk_range_max_context\(head\) \? max_new : mk_range_max_context\(head\);/const size_t n_max = max_new;/~gtest:test_pipeline_sched:*HugeToken*"
  "cli.count-unbounded~tools/cli_options.c~s/x >= lo && x <= hi\)/x >= lo)/~ctest:CountOverTheLimit"
  # Issue 24: one option parser for every command (tools/cli_options.c).
  "cli.alias-not-matched~tools/cli_options.c~s/ \|\| \(o->alias && strcmp\(a, o->alias\) == 0\)//~ctest:meshkern_cli\.(Alias|Usage\.bad_alias)"
  "cli.missing-value-unchecked~tools/cli_options.c~s/if \(i \+ 1 >= argc\) return mk_cli_usage_error/if (0) return mk_cli_usage_error/~ctest:meshkern_cli\.Usage\.missing"
  "cli.unknown-option-unnamed~tools/cli_options.c~s/if \(!o && a\[0\] == '-'\) return/if (0) return/~ctest:meshkern_cli\.Usage\.UnknownOption"
  "cli.help-exits-two~tools/cli_options.c~s/mk_cli_help\(stdout, cmd\);\n            return 0;/mk_cli_help(stdout, cmd);\n            return 2;/~ctest:meshkern_cli\.Help"
  "cli.list-range-unchecked~tools/cli_options.c~s/x < l->lo \|\| x > l->hi/x < l->lo/~ctest:meshkern_cli\.(Usage\.bad_device|TokenIdOutside)"
  "rdv.close-not-dropped~host/stage/rendezvous.c~s/if \(p->have == 0\) mk_rdv_drop\(r, p, MK_OK, NULL, \"closed without a word\"\);/if (p->have == 0) return;/~stage:StageRendezvous.*"
  "rdv.digest-unchecked~host/stage/rendezvous.c~s/\} else if \(strcmp\(h.digest, st->digest\) != 0\) \{/} else if (0) {/~stage:StageRendezvous.*"
  "rdv.duplicate-accepted~host/stage/rendezvous.c~s/\} else if \(st->ctl\[h.rank\].fd >= 0\) \{/} else if (0) {/~stage:StageRendezvous.*"
  "rdv.hello-deadline-ignored~host/stage/rendezvous.c~s/if \(now >= p->deadline\) \{/if (0) {/~stage:StageRendezvous.*"
  "rdv.length-unbounded~host/stage/rendezvous.c~s/if \(len > MK_CTL_MAX_BODY\) \{/if (0) {/~stage:StageRendezvous.*"
  "rdv.rank-range-unchecked~host/stage/rendezvous.c~s/if \(h.rank < 1 \|\| h.rank >= st->world\) \{/if (h.rank < 1) {/~stage:StageRendezvous.*"
  "rdv.joined-close-ignored~host/stage/rendezvous.c~s/else if \(who\[i\] < 0\) MK_TRY\(mk_rdv_check_joined\(r, -who\[i\]\)\);//~stage:StageRendezvous.*"
  "rdv.stranger-ends-the-wait~host/stage/rendezvous.c~s/(        mk_rdv_drop\(r, p, j->told, j->brief\[0\] \? j->brief : NULL, \"%s\", j->why\);\n)/\$1        if (j->claim != MK_OK) r->joined = st->world;\n/~stage:Stage.DigestMismatch*:StageRendezvous.*"
  "messages.getter-clears~host/seam/seam.c~s/(size_t mk_seam_bytes\(const mk_seam \*s\) \{\n)/\$1    mk_clear_error();\n/~stage:*Messages*"
  "busy.beat-not-counted~host/stage/stage_member.c~s/if \(type == MK_CTL_BUSY\) return MK_OK; \/\* rank 0 is computing/if (0) return MK_OK; \/* rank 0 is computing/~stage:Stage.BusyRank*"
  "busy.beat-not-relayed~host/stage/stage_head.c~s/if \(j != k\) \(void\)mk_ctl_send\(&st->ctl\[j\], MK_CTL_BUSY/if (0) (void)mk_ctl_send(\&st->ctl[j], MK_CTL_BUSY/~stage:Stage.BusyRank*"
  "busy.own-requests-not-listed~host/stage/stage_member.c~s/if \(i != \(size_t\)-1 && n \+ 24 < cap\)/if (0)/~stage:Stage.Rank0Fault*"
  "gguf.overlap-unchecked~host/model/gguf.c~s/if \(a->offset \+ a->n_bytes > b->offset\)/if (0)/~gtest:test_gguf_malformed:*"
  "gguf.adjacent-is-overlap~host/model/gguf.c~s/if \(a->offset \+ a->n_bytes > b->offset\)/if (a->offset + a->n_bytes >= b->offset)/~gtest:test_gguf_malformed:*"
  "model_gguf.kv-heads-undivided~host/model/model_gguf.c~s/if \(heads % kv_heads != 0\)/if (0)/~gtest:test_gguf_malformed:*"
  "model_gguf.partial-rope-accepted~host/model/model_gguf.c~s/if \(rope_dims != head_dim\)/if (0)/~gtest:test_gguf_malformed:*"
  "tls.short-psk-accepted~host/net/tls.c~s/n \/ 2 < MK_PSK_MIN/n < 32/~stage:SeamOptions.*"
  "rdv.tls-handshake-skipped~host/stage/rendezvous.c~s/            p->handshaking = true;\n/            p->handshaking = false;\n/~stage:StageTls.*"
  "rdv.tls-failure-kept~host/stage/rendezvous.c~s/if \(mk_tls_handshake_step\(&p->io, &done, &p->events\) != MK_OK\) \{/if (mk_tls_handshake_step(\&p->io, \&done, \&p->events) != MK_OK \&\& 0) {/~stage:StageTls.*"
  # the paged KV cache (common/kv_pages.h, host/range/kv_pool.c) and admission by blocks
  "kvpages.offset-in-block~common/kv_pages.h~s/\(t & \(\(\(size_t\)1 << shift\) - 1\)\)/(t \& (((size_t)1 << shift) - 2))/~ops:*Paged*"
  "kvpages.block-index~common/kv_pages.h~s/table\[t >> shift\]/table[t >> (shift + 1)]/~ops:*Paged*"
  "prefill.row-ignores-table~kernels/attention_prefill.cu~s/mk_kv_page_row\(kv_table, kv_shift, t\) \* kv_stride/t * kv_stride/~ops:*Paged*"
  "prefill.misaligned-cache-taken~kernels/attention_prefill.cu~s/\(\(uintptr_t\)k_cache \| \(uintptr_t\)v_cache\) % 4 != 0/((uintptr_t)k_cache | (uintptr_t)v_cache) % 2 != 0/~ops:*ShapeAndArgumentErrors*"
  "ops.reference-split-drops-pairs~tests/ops/test_ops.cpp~s/items \* \(w \+ 1\) \/ workers, past/items * (w + 1) \/ workers - 1, past/~ops:*AttentionPrefill.*"
  "cpu.kv-store-contiguous~host/backend/cpu/backend_cpu.c~s/const size_t row = mk_kv_row\(pages, pos \+ r\);/const size_t row = pos + r;/~gtest:test_kv_pool:*cpu"
  "cpu.attention-fast-keys-contiguous~host/backend/cpu/cpu_attention_fast.c~s/\*k2 = kh \+ mk_kv_row\(pages, t \+ 2\) \* kv_stride/*k2 = k0 + 2 * kv_stride/~native:*NativeAttention*"
  "kvpool.grow-never-uploads~host/range/kv_pool.c~s/return b->ops->upload_async\(b, seq->table \+ old, seq->host_table \+ old, more \* sizeof\(int32_t\)\);/return MK_OK;/~gtest:test_kv_pool:*cuda_sim"
  "kvpool.promise-kept-after-taking~host/range/kv_pool.c~s/    seq->promised -= own;\n//~gtest:test_kv_pool:*"
  "kvpool.release-keeps-blocks~host/range/kv_pool.c~s/p->free_ids\[p->n_free\+\+\] = seq->host_table\[i\];/(void)0;/~gtest:test_kv_pool:*"
  "kvpool.takes-promised-blocks~host/range/kv_pool.c~s/if \(more - own > p->n_free - p->promised\)/if (more - own > p->n_free)/~gtest:test_kv_pool:*"
  "sched.admit-without-reserve~host/sched/pipeline_sched.c~s/if \(mk_sequence_reserve\(seq, mk_sched_positions\(r->n_prompt, r->max_new\)\) != MK_OK\)/if (0)/~sched:*SmallKvPool*"
  "sched.retire-keeps-blocks~host/sched/pipeline_sched.c~s/for \(size_t i = 0; i < s->n_workers; i\+\+\) \(void\)mk_sequence_reset\(s->workers\[i\].seqs\[item->slot\]\);//~sched:*SmallKvPool*"
  "stage.steps-unreserved~host/stage/stage_head.c~s/!e->ready \|\| !e->reserved \|\|/!e->ready ||/~stage:*StageLibrary*"
  "stage.member-keeps-finished-blocks~host/stage/stage_member.c~s/        mk_slots_release\(&st->slots, body\);\n//~stage:*SmallKvPools*"
  "stage.prefill-takes-no-wait~host/stage/stage_member.c~s/    while \(s == MK_ERR_KV_POOL_FULL\) \{\n        const mk_status c = mk_member_await_finished/    while (0 \&\& s == MK_ERR_KV_POOL_FULL) {\n        const mk_status c = mk_member_await_finished/~stage:*APrefillBefore*"
  "stage.full-member-pool-no-retry~host/stage/stage_member.c~s/    while \(s == MK_ERR_KV_POOL_FULL\) \{\n        MK_TRY\(mk_member_await_finished/    while (0 \&\& s == MK_ERR_KV_POOL_FULL) {\n        MK_TRY(mk_member_await_finished/~stage:*APrefillBefore*"
  "slots.full-table-evicts~host/stage/slots.c~s/if \(!s\)\n            return mk_fail\(MK_ERR_KV_POOL_FULL/if (!s) s = \&t->slot[0];\n        if (!s)\n            return mk_fail(MK_ERR_KV_POOL_FULL/~stageunits:StageSlots.*"
  "decode.row-stride-ignored~kernels/attention_decode.cu~s/  kv_table \+= row \* kv_row_stride;\n//~ops:*DecodeRowsOfMany*"
  "decode.combine-row-ignored~kernels/attention_decode.cu~s/  out \+= row \* \(size_t\)gridDim.x \* hd;\n//~ops:*DecodeRowsOfMany*"
  "decode.row-workspace-shared~kernels/attention_decode.cu~s/  ws \+= row \* row_ws;\n  positions \+= row;/  positions += row;/~ops:*DecodeRowsOfMany*"
  "rope.row-stride-ignored~kernels/rope.cu~s/kv_table \+ row \* kv_row_stride;/kv_table;/~ops:*DecodeRowsOfMany*"
  "bucket.exact-rows~host/range/forward.c~s/while \(rows < n\) rows <<= 1;/while (rows < n) rows += 1;/~gtest:test_batch_forward:*cuda*:BatchForwardCuda.*"
  "bucket.pad-writes-cache~host/range/forward.c~s/for \(size_t i = n; i < rows; i\+\+\) r->host_positions\[i\] = -1;/for (size_t i = n; i < rows; i++) r->host_positions[i] = 0;/~gtest:test_batch_forward:*cuda*:BatchForwardCuda.*"
  "tables.changed-row-skipped~host/range/forward.c~s/if \(memcmp\(row, rows\[k\]->host_table, bytes\) == 0\) continue;/if (k > 0) continue;/~gtest:test_batch_forward:*cuda*:BatchForwardCuda.*"
  "tail.norms-one-row-at-a-time~host/range/forward.c~s/rows - 1 == last \+ run; run\+\+\)/rows - 1 == last + run \&\& 0; run++)/~gtest:test_batch_forward:*cuda*:BatchForwardCuda.*"
  "batch.decode-attention-per-sequence~host/range/forward.c~s/const bool together = p->decode_rows > 0 && ops->decode_rows;/const bool together = false;/~gtest:test_batch_forward:*cuda*:BatchForwardCuda.*"
  "cuda.recording-unlocked~host/backend/cuda/backend_cuda.c~s/    pthread_mutex_lock\(&cb->stream_mu\); \/\* no other/    \/* no other/~backend:*PeerCopyWaits*"
  "kvfits.off-by-a-block~host/range/kv_pool.c~s/if \(need <= p->blocks\) return MK_OK;/if (need <= p->blocks + 1) return MK_OK;/~stage:*ARequestNoPool*"
  "reserve.context-uncapped~host/range/kv_pool.c~s/    if \(positions > r->max_context\) positions = r->max_context;\n    const size_t need = mk_kv_blocks_for\(p, positions\);\n    pthread_mutex_lock/    const size_t need = mk_kv_blocks_for(p, positions);\n    pthread_mutex_lock/~gtest:test_kv_pool:*ASequenceFits*"
  "kvfits.context-uncapped~host/range/kv_pool.c~s/    const mk_kv_pool \*p = &r->kv;\n    if \(positions > r->max_context\) positions = r->max_context;/    const mk_kv_pool *p = \&r->kv;/~gtest:test_kv_pool:*ASequenceFits*"
  "stage.head-never-tells-finished~host/stage/stage_head.c~s/    if \(e->reserved\) \{ \/\*/    if (0) { \/*/~stage:*SmallKvPools*"
  "cpu.dotn-rows-misplaced~host/backend/cpu/cpu_native.c~s/for \(size_t k = 0; k < n; k\+\+\) p->y\[\(r \+ k\) \* out \+ o\] = v\[k\];/for (size_t k = 0; k < n; k++) p->y[(r + k) * out + o] = v[n - 1 - k];/~native:*BatchRows*"
  "cpu.rows8-rows-misplaced~host/backend/cpu/cpu_native.c~s/p->y\[\(r \+ k\) \* out \+ first \+ i\] = v\[8 \* k \+ i\];/p->y[(r + k) * out + first + i] = v[8 * (n - 1 - k) + i];/~gtest:test_batch_forward:*cpu_native*"
  "batch.refusal-keeps-earlier-blocks~host/range/forward.c~s/for \(size_t j = 0; j < i; j\+\+\) mk_kv_shrink/for (size_t j = 0; j < 0; j++) mk_kv_shrink/~gtest:test_kv_pool:*"
  "kvpool.shrink-loses-promise~host/range/kv_pool.c~s/p->promised \+= promised - seq->promised;/(void)0;/~gtest:test_kv_pool:*"
  "cpu.alone-ignored~host/backend/cpu/cpu_native.c~s/\(alone \|\| rows < MK_NATIVE_GEMM_MIN_ROWS \|\|/(rows < MK_NATIVE_GEMM_MIN_ROWS ||/~native:*GemmRowThreshold*"
  # ---- batches across seams (TensorBundle schema 2, mk_seam_send_batch / recv_batch) ----
  "batch.rows-sum-unchecked~host/protocol/bundle_codec.c~s/    if \(row != all.rows\)\n        return mk_fail\(MK_ERR_SHAPE, \"batch entries carry %zu rows, the residual %zu\", row, all.rows\);\n//~gtest:test_seam_batch:SeamBatchMalformed.*"
  "batch.duplicate-ids-accepted~host/protocol/bundle_codec.c~s/if \(strcmp\(h\[j\].request_id, id\) == 0\)/if (0)/~gtest:test_seam_batch:SeamBatchMalformed.*"
  "batch.v1-with-entries-accepted~host/protocol/bundle_codec.c~s/        if \(msg->n_entries\)\n            return mk_fail\(MK_ERR_SCHEMA_VERSION, \"bundle schema version %u carries/        if (0)\n            return mk_fail(MK_ERR_SCHEMA_VERSION, \"bundle schema version %u carries/~gtest:test_seam_batch:SeamBatchMalformed.*"
  "batch.one-entry-over-the-cap~host/protocol/bundle_codec.c~s/if \(msg->n_entries > cap\)/if (msg->n_entries > cap + 1)/~gtest:test_seam_batch:*"
  "batch.entry-offsets-of-entry-zero~host/protocol/bundle_codec.c~s/        row \+= h\[k\].rows;/        row += h[0].rows;/~gtest:test_seam_batch:SeamBatch.*"
  "batch.entry-step-not-packed~host/protocol/bundle_codec.c~s/        p = mk_pb_uint\(p, MK_ENTRY_STEP, e->step\);\n//~gtest:test_seam_batch:SeamBatch.*"
  "batch.entry-position-not-parsed~host/protocol/bundle_codec.c~s/case MK_ENTRY_POSITION: MK_TRY\(mk_expect\(wt, 0\)\); MK_TRY\(mk_varint\(&c, &v\)\); e->position = \(int64_t\)v; break;/case MK_ENTRY_POSITION: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(\&c, \&v)); break;/~gtest:test_seam_batch:SeamBatch.*"
  "batch.shared-fields-unchecked~host/protocol/bundle_codec.c~s/if \(!mk_batch_shared_agree\(h\[0\], h\[k\]\)\)/if (0)/~gtest:test_seam_batch:SeamBatch.*"
  "batch.schema-two-refused-by-contract~host/range/check.c~s/ && h->schema_version != MK_BOUNDARY_BATCH_SCHEMA_VERSION\)/)/~gtest:test_seam_batch:SeamBatch.*"
  "batch.send-rows-unchecked~host/seam/seam.c~s/if \(rows > mk_range_max_rows\(s->range\)\)/if (0)/~gtest:test_seam_batch:SeamBatch.*"
  "batch.refused-entry-marked-ok~host/seam/seam.c~s/        entry_status\[k\] = e;/        entry_status[k] = MK_OK;/~gtest:test_seam_batch:SeamBatch.*"
  "batch.refused-entry-ends-the-message~host/seam/seam.c~s/            if \(errors\) snprintf\(errors\[k\], MK_SEAM_ENTRY_ERROR, \"%s\", mk_last_error\(\)\);/            *n = k + 1;\n            s->seconds += mk_seconds() - t0;\n            return e;/~gtest:test_seam_batch:SeamBatch.*"
  "batch.staged-at-row-zero~host/seam/seam.c~s/rows\[k\] = \(char \*\)staging \+ row \* hidden \* sizeof\(float\);/rows[k] = (char *)staging;/~ncclpipe:*BatchEntriesAreStaged*"
  "batch.entry-rows-from-zero~host/protocol/bundle_codec.c~s/rows\[k\] = residual \+ row \* h\[k\]\.hidden \* sizeof\(float\);/rows[k] = residual;/~gtest:test_seam_batch:SeamBatch.*"
  "codec.field-number-unbounded~host/protocol/bundle_codec.c~s/    if \(key >> 3 > MK_PROTO_MAX_FIELD\) return mk_bad\([^;]*;\n//~seams:FrameView.*"
  "batch.packed-from-entry-zero~host/protocol/bundle_codec.c~s/m->part\[k\] = rows\[k\];/m->part[k] = rows[0];/~gtest:test_seam_batch:SeamBatch.*"
  "batch.local-copies-entry-zero~host/seam/local.c~s/const mk_boundary \*from = link->posted\[k\];/const mk_boundary *from = link->posted[0];/~gtest:test_seam_batch:SeamBatch.*"
  "batch.nccl-batch-in-one-process~host/seam/nccl/nccl_seam.c~s/if \(n != 1 && link->n == 2\)/if (0 \&\& n != 1 \&\& link->n == 2)/~ncclpipe:*ABatchOfSeveral*"
  "batch.nccl-count-not-sent~host/seam/nccl/nccl_seam.c~s/mk_nccl_header_encode\(&b->h, \(unsigned\)\(n - 1 - k\), header\);/mk_nccl_header_encode(\&b->h, 0, header);/~ncclpipe:*ABatchAcross*"
  "batch.nccl-count-unbounded~host/seam/nccl/nccl_seam.c~s/if \(v >= MK_MAX_BATCH_SEQUENCES\)/if (v > MK_MAX_BATCH_SEQUENCES)/~nccl:NcclHeader.*"
  "batch.nccl-rest-of-batch-left~host/seam/seam.c~s/        \} while \(more > 0\);/        } while (0);/~ncclpipe:*ABatchAcross*"
  "batch.nccl-room-unchecked~host/seam/seam.c~s/            if \(k == cap\) \{/            if (k == cap + 1) {/~ncclpipe:*ABatchLarger*"
  "stage.entry-lie-fails-the-run~host/stage/stage_member.c~s/if \(status\[k - taken\] != MK_OK && r->rank_fault\)/if (status[k - taken] != MK_OK)/~stage:*Lying*"
  "stage.refusal-reported-ok~host/stage/stage_head.c~s/mk_head_finish\(h, e, status, why/mk_head_finish(h, e, MK_OK, why/~stage:*Lying*"
  "stage.batch-sent-one-by-one~host/stage/stage_send.c~s/    if \(n == 1\) return mk_stage_send_from\(st, outs\[0\], ids\[0\]\);/    for (size_t k = 0; k < n; k++) MK_TRY(mk_stage_send_from(st, outs[k], ids[k]));\n    if (n > 0) return MK_OK;/~stage:StageLibrary.ReadyRequestsShareRankZerosForward"
  "stage.rank-lie-fails-one-entry~host/stage/stage_member.c~s/    if \(shared != MK_OK\) \{\n        r->rank_fault = true;/    if (shared != MK_OK) {/~stage:*StageFault*other_digest_at_rank1*"
  # ---- the Python binding (python/meshkern/), each caught by the pytest cases its -k names ----
  "py.ids-left-int64~python/meshkern/core.py~s/a = np\.ascontiguousarray\(a\.reshape\(-1\)\.astype\(np\.int32\)\)/a = np.ascontiguousarray(a.reshape(-1))/~py:test_reference_model or test_stages_in_two_threads"
  "py.tokenize-parse-special-as-add-bit~python/meshkern/core.py~s/\(DEFINES\[\x22MK_TOKENIZE_PARSE_SPECIAL\x22\] if parse_special else 0\)/(DEFINES[\x22MK_TOKENIZE_ADD_SPECIAL\x22] if parse_special else 0)/~py:test_chat_template_and_detokenizer"
  "py.sched-stop-ids-dropped~python/meshkern/core.py~s/max_new_tokens, s, ns, sid\)/max_new_tokens, s, 0, sid)/~py:test_scheduler"
  "py.range-token-only-dropped~python/meshkern/core.py~s/    o\.token_only = token_only\n//~py:test_range_input_contract or token_only"
  "py.hparams-rope-layout-inverted~python/meshkern/core.py~s/\x22rotate_half\x22 if int\(d\[\x22rope_layout\x22\]\) == 1 else/\x22rotate_half\x22 if int(d[\x22rope_layout\x22]) == 2 else/~py:hparams"
  "py.generate-text-plain-by-default~python/meshkern/core.py~s/chat: bool = True, stats/chat: bool = False, stats/~py:test_generation_iterator_and_split_parity"
  "py.positions-view-shape-off-by-one~python/meshkern/core.py~s/shape = \(int\(h\.batch\), int\(h\.rows\)\)\n/shape = (int(h.batch), int(h.rows) - 1)\n/~py:test_bundle_views or test_boundary_bundle_wire"
  "py.duck-empty-ids-accepted~python/meshkern/boundary.py~s/if not has_ids or n_ids == 0:/if not has_ids:/~py:test_head_accepts or empty"
  "py.duck-digest-empty-accepted~python/meshkern/boundary.py~s/    if h\.recipe_digest != digest:/    if h.recipe_digest and h.recipe_digest != digest:/~py:test_boundary_seam or digest"
  "py.duck-tail-logits-of-first-row~python/meshkern/boundary.py~s/\[:, -1, :\]/[:, 0, :]/~py:test_reference_model"
  "py.errors-wire-family-short~python/meshkern/errors.py~s/if 40 <= code < 60:/if 40 <= code < 50:/~py:test_exception_classes or famil"
  "py.error-str-loses-message~python/meshkern/errors.py~s/f\x22\{self\.status\} \(\{self\.code\}\): \{message\}\x22 if message/f\x22{self.status} ({self.code})\x22 if message/~py:test_error_carries"
  "py.shard-stateless-inverted~python/meshkern/shard.py~s/if self\.stateless:/if not self.stateless:/~py:test_shard or stateless"
  "py.gguf-layer-count-off-by-one~python/meshkern/gguf.py~s/n_layers = 1 \+ max\(/n_layers = max(/~py:test_reference_model"
  "py.cdef-array-size-plus-one-dropped~python/meshkern/_cdef.py~s/\(int\(m\.group\(1\)\) \+ int\(m\.group\(2\)\)\)/int(m.group(1))/~py:test_digests or test_malformed_bytes"
  "py.c-string-as-latin-1~python/meshkern/_lib.py~s/ffi\.string\(p\)\.decode\(\x22utf-8\x22, \x22replace\x22\)/ffi.string(p).decode(\x22latin-1\x22)/~py:test_model_and_tokenizer or utf8"
  "py.generate-swallows-the-c-error~python/meshkern/core.py~s/        if status:\n            from \.errors import error_for/        if status and not stop.is_set():\n            from .errors import error_for/~py:test_generate_raises"
  "py.sched-cancel-ignored~python/meshkern/core.py~s/        check\(lib\.mk_sched_cancel\(self\._ptr, seq_id\)\)/        pass/~py:cancel_and_release"
  "py.ids-wrap-to-int32~python/meshkern/core.py~s/    if out\.any\(\):  # int32 would wrap/    if False:  # int32 would wrap/~py:int32"
  "py.float-ids-truncated~python/meshkern/core.py~s/    if a\.dtype\.kind not in \x22iu\x22:\n        raise TypeError/    if False:\n        raise TypeError/~py:not_integers"
  "py.batch-of-ids-flattened~python/meshkern/core.py~s/or \(a\.ndim == 2 and a\.shape\[0\] != 1\):/:/~py:batch_of_token_ids"
  "py.nul-in-a-c-string-passes~python/meshkern/core.py~s/    if b\x22\\\\0\x22 in raw:/    if False:/~py:nul"
  "py.exit-frees-parents-first~python/meshkern/core.py~s/for key in sorted\(_PENDING, reverse=True\):/for key in sorted(_PENDING):/~py:free_children_first"
  "py.tls-only-with-psk-or-cert~python/meshkern/core.py~s/if any\(v is not None for v in \(psk_hex, psk_identity, cert_file, key_file, ca_file\)\):/if psk_hex or cert_file:/~py:plaintext"
  "py.sched-wait-stops-at-the-poll-cap~python/meshkern/core.py~s/if info\.n_tokens > len\(info\.tokens\):/if False:/~py:poll_cap"
  "py.generate-worker-error-lost~python/meshkern/core.py~s/            except BaseException as e:  # a bad argument/            except MemoryError as e:  # a bad argument/~py:instead_of_hanging"
  # The cpu reference ops, the dense decode GEMV, the model and tensor schema, the tail result, half conversion, sequences, tensor messages, boundaries, the stage queue and fault injection.
  "cpu_ops.rmsnorm-eps-outside-sqrt~host/backend/cpu/cpu_ops.c~s/1\.0 \/ sqrt\(sum_sq \/ \(double\)cols \+ \(double\)eps\)/1.0 \/ (sqrt(sum_sq \/ (double)cols) + (double)eps)/~gtest:test_cpu_ops:CpuOps.*"
  "cpu_ops.attention-long-row-keys-of-head-zero~host/backend/cpu/cpu_ops.c~s/kv_stride \+ kvh \* head_dim;\n                dot = 0\.0f;/kv_stride;\n                dot = 0.0f;/~gtest:test_cpu_ops:Shapes/CpuAttention.*"
  "cpu_ops.rope-table-sin-as-cos~host/backend/cpu/cpu_ops.c~s/&table\[\(p \* half \+ i\) \* 2\], &table\[\(p \* half \+ i\) \* 2 \+ 1\]/\&table[(p * half + i) * 2 + 1], \&table[(p * half + i) * 2]/~gtest:test_boundary_contract:OutputSide.*"
  "gemv.multi-row-stride-of-the-total~kernels/gemv.cu~s/y\[\(size_t\)r \* out \+ o\] = acc\[r\];/y[(size_t)r * total_out + o] = acc[r];/~ops:*GemvMulti*"
  "gemv.half-vector-width-of-f32~kernels/gemv.cu~s/const size_t per = D == MK_DTYPE_F32 \? 4 : 8;/const size_t per = 4;/~ops:Ops/Gemv.*/f16_*:Ops/Gemv.*/bf16_*:*GemvMulti*"
  "gemv.multi-null-weight-unchecked~kernels/gemv.cu~s/if \(out_dim\[i\] && \(!y\[i\] \|\| !w\[i\]\)\)/if (out_dim[i] \&\& !y[i])/~ops:*GemvMulti*"
  "model_c.kv-heads-not-a-divisor-accepted~host/model/model.c~s/if \(hp->n_heads % hp->n_kv_heads != 0\)/if (0)/~gtest:test_boundary_contract:RandomModel.*"
  "model_c.weights-ignore-the-seed~host/model/model.c~s/mk_hash_name\(m->seed, name\)/mk_hash_name(0, name)/~gtest:test_boundary_contract:RandomModel.*"
  "model_c.short-buffer-accepted~host/model/model.c~s/if \(expected != n\)/if (expected < n)/~gtest:test_boundary_contract:RandomModel.*"
  "tail_result.logits-shape-swapped~host/protocol/tail_result.c~s/uint64_t shape\[2\] = \{batch, vocab\};/uint64_t shape[2] = {vocab, batch};/~gtest:test_bundle_malformed:TailResult.*"
  "tail_result.id-of-the-full-length-accepted~host/protocol/tail_result.c~s/strlen\(id->request_id\) >= sizeof local\.request_id/strlen(id->request_id) > sizeof local.request_id/~gtest:test_bundle_malformed:TailResult.*"
  "tail_result.negative-token-accepted-on-receipt~host/protocol/tail_result.c~s/if \(msg->sampled_token_id < 0\) return/if (0) return/~gtest:test_bundle_malformed:TailResult.*"
  "half.subnormal-ties-away~host/core/half.c~s/\(rem == halfway && \(half_mant & 1u\)\)/(rem == halfway)/~gtest:test_cpu_ops:CpuOps.Half*"
  "half.normal-ties-away~host/core/half.c~s/\(rem == 0x1000u && \(h & 1u\)\)/(rem == 0x1000u)/~gtest:test_cpu_ops:CpuOps.Half*"
  "tensor_schema.layer-past-the-last-parsed~host/model/tensor_schema.c~s/\(unsigned long long\)l >= n_layers\)/(unsigned long long)l > n_layers)/~gtest:test_boundary_contract:RandomModel.*"
  "sequence.rewind-past-the-end-accepted~host/range/sequence.c~s/if \(length > seq->length\)/if (length > seq->length + 1)/~gtest:test_parity:Sequences.*"
  "tensor_msg.longer-data-accepted~host/protocol/tensor_msg.c~s/if \(t->data\.len != bytes\)/if (t->data.len < bytes)/~gtest:test_bundle_malformed:MalformedBundle.*"
  "boundary_c.read-one-row-short-accepted~host/range/boundary.c~s/if \(n > capacity_floats\)/if (n > capacity_floats + bd->h.hidden)/~gtest:test_seam_batch:SeamBatch.ABoundaryIs*"
  "queue.pop-if-head-not-wrapped~host/sched/queue.c~s/    if \(item\) \{\n        q->head = \(q->head \+ 1\) % q->cap;/    if (item) {\n        q->head = q->head + 1;/~sched:PipelineQueue.*"
  "fault.due-from-its-step-on~host/stage/fault.c~s/f->step == step;/f->step <= step;/~stage:StageLibrary.ALyingEntryOfABatchFailsOnlyItsRequest"
  "seam.ticket-not-compared~host/seam/seam.c~s/if \(diff\) return mk_fail/if (0) return mk_fail/~stage:StageSeam.*"
  "seam.stranger-ends-the-wait~host/seam/seam.c~s/            dropped\+\+;\n            continue;/            return st;/~stage:StageSeam.*"
  "seam.stranger-gets-the-whole-wait~host/seam/seam.c~s/mk_now_ms\(\) \+ mk_ticket_budget_ms\(l->options.connect_timeout_ms\)/deadline/~stage:StageSeam.*"
  "stream.body-waits-the-whole-deadline~host/seam/stream.c~s/wait_ms >= 4 \? wait_ms \/ 4 : 1, \"frame body\"/wait_ms * 4, \"frame body\"/~stage:*half_frame*"
  "io.stall-clock-not-reset~host/net/io.c~s/            moved_at = now;\n//~seams:FaultyPeer.*"
  "io.stall-limit-is-the-deadline~host/net/io.c~s/moved_at \+ stall_ms < deadline \? moved_at \+ stall_ms : deadline/deadline/~seams:FaultyPeer.*"
  "stage.stray-result-ends-the-run~host/stage/stage_head.c~s/        mk_clear_error\(\);\n        return MK_OK;\n    \}\n    h->deadline = 0;/        return mk_fail(MK_ERR_TAIL_RESULT, \"stray\");\n    }\n    h->deadline = 0;/~stage:*NeverAdmitted*"
  "sched.prompt-id-at-vocab-taken~host/sched/pipeline_sched.c~s/\(size_t\)prompt\[i\] >= s->vocab\)/(size_t)prompt[i] > s->vocab)/~sched:*BadSequence*"
  "sched.entry-unchecked-in-a-batch~host/sched/worker.c~s/s = mk_range_check_batch_entry\(st->range, &e, n\);/(void)e;/~sched:*PastItsContext*"
  "serve.endless-chunked-body-read~tools/serve.c~s/return mk_refuse_upload\(c\);/*upload_size = 0;\n        return MHD_YES;/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.top-p-zero-refused~tools/serve_req.c~s/!\(f->valuedouble >= 0\)/!(f->valuedouble > 0)/~ctest:meshkern_serve.OpenAIClientAndCurl"
  "serve.key-file-nul-taken~tools/serve.c~s/: memchr\(key, '\\\\0', n\) \?/: 0 ?/~ctest:meshkern_cli\.Input\.key_file"
  "cli.prompt-id-sign-taken~tools/run_batch.c~s/if \(\*p < '0' \|\| \*p > '9'\) return false;//~ctest:meshkern_cli\.Input\.(signed|blank)"
  "cli.device-on-cpu-ignored~tools/cli_backend.c~s/if \(b->device_given && /if (0 \&\& b->device_given \&\& /~ctest:meshkern_cli\.Input\.device"
  "cli.kv-pool-first-wins~tools/cli_backend.c~s/b->kv_pool_blocks = units\[i\].shift \? 0 : \(size_t\)n;/if (!units[i].shift) b->kv_pool_blocks = (size_t)n;/~ctest:meshkern_cli\.Input\.kv_pool"
  "cli.help-taken-from-text~tools/cli_options.c~s/if \(\(size_t\)i < n_pos && strcmp\(cmd->positional\[i\], \"TEXT\"\) == 0\) continue;//~ctest:meshkern_cli\.Input\.tokenize_h"
  "cli.chat-cr-kept~tools/cli_text.c~s/line\[len - 1\] == '\\\\n' \|\| line\[len - 1\] == '\\\\r'\)\) line\[--len\]/line[len - 1] == '\\\\n')) line[--len]/~ctest:meshkern_cli\.Input\.chat_crlf"
  "cli.unused-flag-taken~tools/cli_options.c~s/    if \(ok\) return -1;\n/    return -1;\n/~ctest:meshkern_cli\.Input\.(seam|tls|http|batch_seam)"
  "cli.given-reads-a-value-as-option~tools/cli_options.c~s/if \(o >= group->opt && o < group->opt \+ group->n\) return argv\[i\];\n        if \(o->meta\) i\+\+;/if (o >= group->opt \&\& o < group->opt + group->n) return argv[i];/~ctest:meshkern_cli\.Input\.(seam|tls|http|batch_seam|value_spelled)"
  "cli.speed-on-cpu-taken~tools/cli_backend.c~s/if \(\(b->config.speed_mode \|\| b->eager_decode\) && /if ((b->eager_decode) \&\& /~ctest:meshkern_cli\.Input\.speed_on_cpu"
  "cli.seam-address-on-wire-taken~tools/meshkern.c~s/seam.kind != MK_SEAM_UNIX && seam.kind != MK_SEAM_TCP && mk_cli_given/seam.kind != MK_SEAM_UNIX \&\& seam.kind != MK_SEAM_TCP \&\& seam.kind != MK_SEAM_WIRE \&\& mk_cli_given/~ctest:meshkern_cli\.Input\.seam"
  "cli.http-flags-without-serve~tools/stage_cmd.c~s/&groups\[1\], 1, a->serve.enabled,/\&groups[1], 2, a->serve.enabled,/~ctest:meshkern_cli\.Input\.http"
  # from an independent bug-planting audit (session 23): each was missed, each now caught
  "status.name-missing~host/core/error.c~s/        MK_NAME\(MK_ERR_CONNECT\)\n//~gtest:test_api_rules:StatusNames.*"
  "protocol.rank-one-past-the-bound~host/protocol/tensor_msg.c~s/if \(t->n_shape > max_rank\)/if (t->n_shape > max_rank + 1)/~gtest:test_bundle_malformed:*RankPast*"
  "serve.address-port-65536~tools/serve_options.c~s/ \|\| port > 65535\)/ || port > 65536)/~ctest:meshkern_cli\.Input\.serve_port"
  "stage.text-answer-keeps-stop-id~tools/stage_cmd.c~s/const size_t n = r->stopped && r->n_tokens \? r->n_tokens - 1 : r->n_tokens;/const size_t n = r->n_tokens;/~ctest:stage\.text"
  "sched.timeline-base-zero~host/sched/timeline.c~s/uint64_t base = UINT64_MAX;/uint64_t base = 0;/~sched:*Timeline*"
  "sched.reset-keeps-timeline~host/sched/pipeline_sched.c~s/        s->workers\[i\].timeline_len = 0;\n//~sched:*Timeline*"
  "sched.cancelled-tail-dangles~host/sched/pipeline_sched.c~s/if \(s->pending_tail == r\) s->pending_tail = prev;/if (s->pending_tail == r) s->pending_tail = prev ? r : r;/~sched:*CancelAndRelease*"
  "sched.poll-ignores-cap~host/sched/pipeline_sched.c~s/memcpy\(tokens, r->tokens, \(cap < r->n_tokens \? cap : r->n_tokens\) \* sizeof \*tokens\)/memcpy(tokens, r->tokens, r->n_tokens * sizeof *tokens)/~sched:*PollCopies*"
  "gen.decode-time-last-step-only~host/pipeline/generate.c~s/else st.decode_s \+= dt;/else st.decode_s = dt;/~gen:*WithoutAnEndToken*"
  "cli.random-head-dim-not-derived~tools/meshkern.c~s/if \(!head_dim_set && hp.n_heads\) hp.head_dim/if (!head_dim_set \&\& hp.n_heads \&\& 0) hp.head_dim/~ctest:meshkern_cli\.Input\.random_head_dim"
  "range.default-context-uncapped~host/range/range.c~s/    if \(!opt->max_context && max_context > 4096\) max_context = 4096;\n//~gtest:test_kv_pool:*DefaultContext*"
  "kv.default-pool-ignores-step-sequences~host/range/kv_pool.c~s/const size_t sequences = r->max_seqs > MK_KV_DEFAULT_SEQUENCES \? r->max_seqs : MK_KV_DEFAULT_SEQUENCES;/const size_t sequences = MK_KV_DEFAULT_SEQUENCES;/~gtest:test_kv_pool:*BadPoolOptions*"
  "kv.reserve-ignores-own-promise~host/range/kv_pool.c~s/const size_t have = seq->n_blocks \+ seq->promised;/const size_t have = seq->n_blocks;/~gtest:test_kv_pool:*ReservedBlocks*"
  "range.more-sequences-than-rows~host/range/range.c~s/if \(max_seqs > MK_MAX_BATCH_SEQUENCES \|\| max_seqs > max_rows\)/if (max_seqs > MK_MAX_BATCH_SEQUENCES)/~gtest:test_batch_forward:BatchForwardRules.RefusalsNameTheEntry*"
  "range.digest-bf16-kv-as-f16~host/range/range.c~s/kv == MK_DTYPE_F16 \? \x22;kv=f16\x22 : kv == MK_DTYPE_BF16 \? \x22;kv=bf16\x22 : \x22\x22/kv == MK_DTYPE_F16 || kv == MK_DTYPE_BF16 ? \x22;kv=f16\x22 : \x22\x22/~backend:*HalfKvCache*"
  "weights.untied-tail-loads-embedding~host/range/weights.c~s/if \(mk_role_owns_embedding\(r->role\) \|\| \(mk_role_owns_final_head\(r->role\) && tied\)\)/if (mk_role_owns_embedding(r->role) || mk_role_owns_final_head(r->role))/~gtest:test_parity:*EachRangeHolds*"
  "sequence.rewind-in-place-takes-a-step~host/range/sequence.c~s/if \(length < seq->length && seq->steps\) seq->steps--;/if (seq->steps) seq->steps--;/~gtest:test_parity:*CountTheirSequencesSteps*"
  "sequence.reset-keeps-steps~host/range/sequence.c~s/    seq->length = 0;\n    seq->steps = 0;\n/    seq->length = 0;\n/~gtest:test_parity:*CountTheirSequencesSteps*"
  "stage.hop-latency-base-sign~host/stage/stage_runtime.c~s/ \+ n \* \(double\)\(rx->base_ns - tx->base_ns\)/ - n * (double)(rx->base_ns - tx->base_ns)/~stageunits:StageHops.*"
  "stage.mean-latency-unweighted~tools/stage_cmd.c~s/latency \+= hop.latency_s \* \(double\)hop.boundaries;/latency += hop.latency_s;/~stage:*StageParity*"
  "stage.default-pool-floor~host/stage/stage_runtime.c~s/ro.kv_pool_blocks = st->max_sequences \* \(\(st->max_context \+ block - 1\) \/ block\);/ro.kv_pool_blocks = st->max_sequences * (st->max_context \/ block);/~stage:*DefaultPoolHolds*"
  "py.generate-stats-decode-dropped~python/meshkern/core.py~s/\x22prefill_s\x22, \x22decode_s\x22\)/\x22prefill_s\x22)/~py:wire_split_bit_exact"
  "py.shard-options-dropped~python/meshkern/shard.py~s/self._range = core.Range\(self.model, self.start_layer, self.end_layer, \*\*self._options\)/self._range = core.Range(self.model, self.start_layer, self.end_layer)/~py:shard_passes"
  "py.callback-keeps-latest-error~python/meshkern/core.py~s/                        if not cb_error:\n                            cb_error.append\(e\)/                        cb_error.append(e)/~py:on_token_exception"
  "sched.share-drops-head-cost~host/sched/pipeline_sched.c~s/double c = \(i == 0 \? head : 0\) \+ /double c = /~sched:*SharesCount*"
  "stage.rendezvous-evicts-newest~host/stage/rendezvous.c~s/else if \(!oldest \|\| q->since < oldest->since\) oldest = q;/else if (!oldest || q->since > oldest->since) oldest = q;/~stage:*FullTableOfSilent*"
  "stage.wrap-drops-cause~host/stage/control.c~s/return mk_fail\(status, \x22%s: %s\x22, prefix, cause\);/return mk_fail(status, \x22%s\x22, prefix);/~stageunits:StageControl.*"
  "sched.link-sends-without-waiting~host/sched/link.c~s/    MK_TRY\(mk_seam_send_wait\(tx\)\); \/\*[^\n]*\n//~gtest:test_sched_cuda_sim:*Nccl*"
  "race.peer-source-overwritten~host/backend/cuda/backend_cuda.c~s/    if \(e == cudaSuccess\) e = cudaSetDevice\(pb->device\);\n    if \(e == cudaSuccess\) e = cudaStreamWaitEvent\(pb->stream, cb->seam_event, 0\);\n//~backend:*PeerCopyIsOrdered*"
  "race.peer-copy-before-source~host/backend/cuda/backend_cuda.c~s/if \(e == cudaSuccess\) e = cudaStreamWaitEvent\(cb->stream, pb->seam_event, 0\);//~backend:*PeerCopyIsOrdered*"
)

log() { printf '%s\n' "$*" >&2; }
# Run a command and wait for it with the `wait` builtin: a Ctrl-C then reaches the INT trap
# at once (bash defers traps while a foreground child runs, and skips them when the child
# exits normally, as ninja does when interrupted).
run() {
  "$@" &
  wait $!
}

# ---- the copy of the tree --------------------------------------------------------------
mkdir -p "$SRC"
cd "$ROOT"
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  if ! cmp -s "$f" "$SRC/$f"; then
    mkdir -p "$SRC/$(dirname "$f")"
    # a fresh mtime: a file edited before the last build of the copy must still rebuild
    cp "$f" "$SRC/$f"
  fi
done < <(git ls-files -z -co --exclude-standard)
ln -sfn "$(readlink -f "$ROOT/models" 2>/dev/null || echo "$ROOT/models")" "$SRC/models"

# Restore the mutated file of the copy on any exit, including Ctrl-C.
MUTATED=""
# The file is restored from the copy taken before it was mutated, not from the working tree:
# the tree may change while a pass runs (a commit, a merge) and the copy must stay one tree.
PRISTINE="$WORK/pristine"
restore() {
  if [ -n "$MUTATED" ]; then
    cp -p "$PRISTINE" "$SRC/$MUTATED"
    touch "$SRC/$MUTATED" # newer than the mutated build: the next build recompiles it
    MUTATED=""
  fi
}
trap 'restore' EXIT
trap 'restore; exit 130' INT TERM

# The specs of the mutations this run plants (ONLY), and the targets those suites need.
SPECS=()
for m in "${MUTATIONS[@]}"; do
  IFS='~' read -r id _ _ spec <<<"$m"
  [[ "$id" =~ $ONLY ]] || continue
  [[ " ${SPECS[*]} " == *" $spec "* ]] || SPECS+=("$spec")
done
[ ${#SPECS[@]} -gt 0 ] || { log "no mutation id matches '$ONLY'"; exit 2; }
spec_targets() { # $1 = test spec: the build targets its suite needs
  case "$1" in
    ops:*) echo test_ops_sim ;;
    backend:*) echo test_cuda_backend_sim ;;
    host) echo test_boundary_contract test_bundle_malformed test_parity ;;
    sched) echo test_pipeline_sched ;;
    stage | stage:*) echo test_stage meshkern_cli ;;
    native:*) echo test_cpu_native ;;
    seams:*) echo test_seams ;;
    nccl:*) echo test_nccl_seam_sim ;;
    ncclpipe:*) echo test_nccl_pipeline_sim ;;
    stageunits:*) echo test_stage_units ;;
    sched:*) echo test_pipeline_sched ;;
    gen:*) echo test_generate ;;
    text:*) echo test_tokenizer ;;
    gtest:*) local rest="${1#gtest:}"; echo "${rest%%:*}" ;;
    ctest:*) echo meshkern_cli ;;
    py:*) echo meshkern ;;
  esac
}
TARGETS=()
for spec in "${SPECS[@]}"; do
  for t in $(spec_targets "$spec"); do
    [[ " ${TARGETS[*]} " == *" $t "* ]] || TARGETS+=("$t")
  done
done

log "== configure and build the simulated suites in $BUILD: ${TARGETS[*]:-(none)}"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHKERN_CUDA=OFF -DMESHKERN_TESTS=ON \
  >"$WORK/configure.log" 2>&1 || { tail -20 "$WORK/configure.log"; exit 2; }
build() { [ ${#TARGETS[@]} -eq 0 ] || run ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]}"; }
build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 2; }
if [[ " ${SPECS[*]}" == *" py:"* ]] && [ ! -x "$WORK/pyvenv/bin/python" ]; then
  log "== a venv for the Python binding's suite in $WORK/pyvenv"
  { python3 -m venv "$WORK/pyvenv" && "$WORK/pyvenv/bin/python" -m pip install -q cffi numpy pytest; } \
    >"$WORK/pyvenv.log" 2>&1 || { rm -rf "$WORK/pyvenv"; tail -20 "$WORK/pyvenv.log"; exit 2; }
fi

# The unmutated suites must be green first, or no red means anything.
gtest() { # $1 = binary under $BUILD/tests, $2 = filter
  run timeout 900 "$BUILD/tests/$1" --gtest_filter="$2" >>"$WORK/run.log" 2>&1
}
run_tests() { # $1 = test spec; returns 0 when every test passed
  case "$1" in
    ops:*)
      local filter="${1#ops:}"
      CUDASIM_ORDER=forward run timeout 900 "$BUILD/tests/ops/test_ops_sim" --gtest_filter="$filter" >>"$WORK/run.log" 2>&1 &&
        CUDASIM_ORDER=random CUDASIM_SEED=7 run timeout 900 "$BUILD/tests/ops/test_ops_sim" --gtest_filter="$filter" \
          >>"$WORK/run.log" 2>&1
      ;;
    backend:*)
      local filter="${1#backend:}"
      CUDASIM_ORDER=forward run timeout 900 "$BUILD/tests/backend/test_cuda_backend_sim" --gtest_filter="$filter" \
        >>"$WORK/run.log" 2>&1
      ;;
    host)
      local t
      for t in test_boundary_contract test_bundle_malformed test_parity; do
        run timeout 900 "$BUILD/tests/$t" >>"$WORK/run.log" 2>&1 || return 1
      done
      ;;
    sched)
      run timeout 900 "$BUILD/tests/test_pipeline_sched" >>"$WORK/run.log" 2>&1
      ;;
    sched:*)
      run timeout 900 "$BUILD/tests/test_pipeline_sched" --gtest_filter="${1#sched:}" >>"$WORK/run.log" 2>&1
      ;;
    gen:*)
      run timeout 900 "$BUILD/tests/test_generate" --gtest_filter="${1#gen:}" >>"$WORK/run.log" 2>&1
      ;;
    text:*)
      run timeout 900 "$BUILD/tests/test_tokenizer" --gtest_filter="${1#text:}" >>"$WORK/run.log" 2>&1
      ;;
    stage)
      run timeout 900 "$BUILD/tests/stage/test_stage" >>"$WORK/run.log" 2>&1
      ;;
    stage:*)
      run timeout 900 "$BUILD/tests/stage/test_stage" --gtest_filter="${1#stage:}" >>"$WORK/run.log" 2>&1
      ;;
    gtest:*)
      local rest="${1#gtest:}" bin
      bin=$(find "$BUILD/tests" -name "${rest%%:*}" -type f -perm -u+x | head -1)
      [ -n "$bin" ] || { log "no test binary ${rest%%:*} in $BUILD/tests"; return 2; }
      run timeout 900 "$bin" --gtest_filter="${rest#*:}" >>"$WORK/run.log" 2>&1
      ;;
    ctest:*)
      (cd "$BUILD" && run timeout 900 ctest -R "${1#ctest:}" --output-on-failure) >>"$WORK/run.log" 2>&1
      ;;
    native:*)
      run timeout 900 "$BUILD/tests/test_cpu_native" --gtest_filter="${1#native:}" >>"$WORK/run.log" 2>&1
      ;;
    seams:*) gtest test_seams "${1#seams:}" ;;
    nccl:*) gtest nccl_seam/test_nccl_seam_sim "${1#nccl:}" ;;
    ncclpipe:*) gtest nccl_seam/test_nccl_pipeline_sim "${1#ncclpipe:}" ;;
    stageunits:*) gtest stage/test_stage_units "${1#stageunits:}" ;;
    py:*)
      # The copy's package (python/meshkern imports the header from the copy's include/).
      # No bytecode: a restored file can keep the mutated one's size and mtime second, and
      # Python would then load the mutant's stale .pyc in every later run.
      PYTHONPATH="$SRC/python" MESHKERN_LIB="$BUILD/host/libmeshkern.so" MESHKERN_REQUIRE_MODEL=1 PYTHONDONTWRITEBYTECODE=1 \
        run timeout 900 "$WORK/pyvenv/bin/python" -m pytest "$SRC/python/tests" -x -q -p no:cacheprovider \
        -k "${1#py:}" >>"$WORK/run.log" 2>&1
      ;;
    api)
      run python3 "$SRC/tests/api_surface_check.py" clears "$SRC/include/meshkern.h" "$SRC/host" >>"$WORK/run.log" 2>&1
      ;;
    *) log "unknown test spec $1"; return 2 ;;
  esac
}

# The unmutated tree first: every test spec the selected mutations use must pass.
: >"$WORK/run.log"
# Baselines: each spec this run uses, once (a suite already red unmutated would read as
# every mutation caught).
for spec in "${SPECS[@]}"; do
  run_tests "$spec" || { log "the unmutated suite ($spec) fails: see $WORK/run.log"; exit 2; }
done

# ---- one mutation at a time ------------------------------------------------------------
results=()
caught=0
total=0
for m in "${MUTATIONS[@]}"; do
  IFS='~' read -r id file subst spec <<<"$m"
  [[ "$id" =~ $ONLY ]] || continue
  total=$((total + 1))
  cp -p "$SRC/$file" "$PRISTINE"
  MUTATED="$file"
  perl -0pi -e "$subst" "$SRC/$file"
  if cmp -s "$PRISTINE" "$SRC/$file"; then
    results+=("$id"$'\x1f'"$file"$'\x1f'"$spec"$'\x1f'"NOT APPLIED (pattern not found: a stale line)")
    restore
    continue
  fi
  changed=$(diff "$PRISTINE" "$SRC/$file" | grep -c '^[<>]')
  log "== $id ($file, $changed line(s) differ; tests: $spec)"
  echo "==== $id" >>"$WORK/run.log"
  if [ "$spec" != api ] && ! run ninja -C "$BUILD" -j "$JOBS" $(spec_targets "$spec") >>"$WORK/build.log" 2>&1; then
    verdict="build failed (not counted)"
  elif run_tests "$spec"; then
    verdict="NO  <- test gap"
  else
    verdict="yes"
    caught=$((caught + 1))
  fi
  results+=("$id"$'\x1f'"$file"$'\x1f'"$spec"$'\x1f'"$verdict") # a spec's regex may hold '|'
  # each verdict as it comes, so a pass cut short still says what it found
  log "   caught: $verdict"
  echo "==== $id caught: $verdict" >>"$WORK/run.log"
  restore
done
# Leave the build matching the unmutated copy.
build >>"$WORK/build.log" 2>&1

printf '\n%-38s %-32s %-36s %s\n' "mutation" "file" "suite" "caught"
printf '%-38s %-32s %-36s %s\n' "--------" "----" "-----" "------"
for r in "${results[@]}"; do
  IFS=$'\x1f' read -r id file spec verdict <<<"$r"
  printf '%-38s %-32s %-36s %s\n' "$id" "$file" "$spec" "$verdict"
done
printf '\n%d of %d mutations caught (logs: %s/run.log, build.log)\n' "$caught" "$total" "$WORK"
[ "$caught" -eq "$total" ]
