/* meshkern: run contiguous layer ranges ("shards") of dense Llama-family models and
 * move the unnormalized residual stream across the seams between them.
 *
 * Public C API. Every fallible call returns an mk_status; mk_last_error() gives a
 * readable message of the last failure on the calling thread.
 *
 * Ownership: every mk_X_create / mk_X_open has a paired mk_X_free that accepts NULL.
 * Buffers returned through out-pointers are owned by the caller and released with the
 * free function named next to the call. */
#ifndef MESHKERN_H
#define MESHKERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MK_API __declspec(dllexport)
#else
#define MK_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ===================================================================== status == */

typedef enum mk_status {
    MK_OK = 0,
    /* generic */
    MK_ERR_INVALID_ARGUMENT = 1,
    MK_ERR_OUT_OF_MEMORY = 2,
    MK_ERR_IO = 3,
    MK_ERR_INTERNAL = 4,
    MK_ERR_UNSUPPORTED = 5,
    /* architecture registry and roles */
    MK_ERR_UNCERTIFIED_ARCHITECTURE = 10,
    MK_ERR_INVALID_RANGE = 11,
    /* boundary contract (executor input side) */
    MK_ERR_HEAD_OWNS_EMBEDDING = 20,   /* head/full given a bundle */
    MK_ERR_BYPASS_EMBEDDING = 21,      /* middle/tail given token ids */
    MK_ERR_BUNDLE_REQUIRED = 22,       /* middle/tail given nothing */
    MK_ERR_SEAM_MISMATCH = 23,         /* bundle next_layer != range start */
    MK_ERR_NORMALIZED_BUNDLE = 24,     /* bundle marked normalized */
    MK_ERR_EMPTY_INPUT = 25,           /* no token ids / zero rows */
    MK_ERR_TOKEN_OUT_OF_RANGE = 26,
    MK_ERR_CONTEXT_OVERFLOW = 27,      /* KV cache full */
    MK_ERR_UNCERTIFIED_SAMPLING = 28,
    /* wire / bundle validation */
    MK_ERR_WIRE_DECODE = 40,           /* bytes are not a protobuf message (truncated, random) */
    MK_ERR_MISSING_FIELD = 41,
    MK_ERR_SCHEMA_VERSION = 42,
    MK_ERR_TENSOR_NAME = 43,
    MK_ERR_ARCHITECTURE_MISMATCH = 44,
    MK_ERR_HIDDEN_WIDTH = 45,
    MK_ERR_DTYPE = 46,
    MK_ERR_BYTE_ORDER = 47,
    MK_ERR_SHAPE = 48,                 /* rank or dims invalid */
    MK_ERR_SHAPE_OVERFLOW = 49,        /* product of dims overflows */
    MK_ERR_DATA_LENGTH = 50,           /* bytes != shape x dtype */
    MK_ERR_POSITIONS_SHAPE = 51,
    MK_ERR_RECIPE_DIGEST = 52,
    MK_ERR_BOUNDARY_POINT = 53,
    MK_ERR_REQUIRED_TENSORS = 54,      /* moe/mla bundles lacking their named tensors */
    MK_ERR_TAIL_RESULT = 55,           /* TailResult identity / output invalid */
    /* model files */
    MK_ERR_GGUF_TRUNCATED = 60,
    MK_ERR_GGUF_MAGIC = 61,
    MK_ERR_GGUF_VERSION = 62,
    MK_ERR_GGUF_COUNT = 63,            /* absurd kv / tensor / array counts */
    MK_ERR_GGUF_STRING = 64,           /* string length past the end or absurd */
    MK_ERR_GGUF_VALUE_TYPE = 65,       /* unknown metadata value type */
    MK_ERR_GGUF_TENSOR_TYPE = 66,      /* unknown or unsupported tensor type */
    MK_ERR_GGUF_DIMS = 67,             /* bad rank, zero dim or dim product overflow */
    MK_ERR_GGUF_ALIGNMENT = 68,        /* misaligned tensor offset or bad alignment key */
    MK_ERR_GGUF_DATA_BOUNDS = 69,      /* tensor data past the end of file */
    MK_ERR_GGUF_MISSING = 70,          /* required key or tensor missing */
    MK_ERR_GGUF_HPARAMS = 71,          /* inconsistent hyper-parameters */
    /* devices */
    MK_ERR_NO_DEVICE = 80,
    MK_ERR_DEVICE_INDEX = 81,
    MK_ERR_DEVICE_MEMORY = 82,
    MK_ERR_CUDA = 83,
    MK_ERR_CUBLAS = 84,
    MK_ERR_NCCL = 85,
    MK_ERR_KERNEL_LAUNCH = 86,
} mk_status;

/* Symbolic name of a status ("MK_ERR_SEAM_MISMATCH"); never NULL. */
MK_API const char *mk_status_name(mk_status status);
/* Message of the last failure on this thread ("" if none). Valid until the next call
 * into meshkern on this thread. */
MK_API const char *mk_last_error(void);

/* ====================================================== architecture registry == */

#define MK_DENSE_LLAMA_ADAPTER "dense-llama"
#define MK_RESIDUAL_TENSOR_NAME "residual_stream"
#define MK_BOUNDARY_SCHEMA_VERSION 1u
#define MK_BOUNDARY_POINT "dense.residual.v1"

typedef struct mk_architecture {
    const char *adapter;              /* canonical adapter name, e.g. "dense-llama" */
    const char *boundary_tensor_name; /* e.g. "residual_stream" */
} mk_architecture;

/* Resolve a name or alias (dense-llama, llama, LlamaForCausalLM, LlamaModel). Anything
 * else, including "" and NULL, fails closed with MK_ERR_UNCERTIFIED_ARCHITECTURE. */
MK_API mk_status mk_certified_architecture(const char *name, mk_architecture *out);
MK_API bool mk_is_certified_architecture(const char *name);

/* Protocol-level architecture kinds: the protocol can describe bundles for kinds it
 * cannot execute (moe, mla); those are validated and refused for execution. */
typedef enum mk_protocol_arch {
    MK_PROTOCOL_ARCH_DENSE = 1,
    MK_PROTOCOL_ARCH_MOE = 2,
    MK_PROTOCOL_ARCH_MLA = 3,
} mk_protocol_arch;

/* Names a bundle of this kind must carry (NULL-terminated, static storage). */
MK_API const char *const *mk_protocol_required_tensors(mk_protocol_arch arch);
/* Check a set of tensor names against the protocol requirements of arch. */
MK_API mk_status mk_protocol_check_tensors(mk_protocol_arch arch, const char *const *names,
                                           size_t n_names);

/* ====================================================================== roles == */

typedef enum mk_role { MK_ROLE_HEAD = 1, MK_ROLE_MIDDLE, MK_ROLE_TAIL, MK_ROLE_FULL } mk_role;

/* Inclusive range [start, end] of a model with `total` layers. */
MK_API mk_status mk_role_for_range(int64_t start, int64_t end, int64_t total, mk_role *out);
MK_API bool mk_role_owns_embedding(mk_role role);
MK_API bool mk_role_owns_final_head(mk_role role);
MK_API const char *mk_role_name(mk_role role);

/* ==================================================================== sampling == */

typedef enum mk_sampling_mode {
    MK_SAMPLING_GREEDY = 0,
    MK_SAMPLING_TOP_P = 1,
    MK_SAMPLING_TOP_K = 2,
    MK_SAMPLING_TEMPERATURE = 3,
} mk_sampling_mode;

typedef struct mk_sampling_contract {
    mk_sampling_mode mode;
} mk_sampling_contract;

/* Build a sampling contract. Only greedy is certified; other modes are refused with
 * MK_ERR_UNCERTIFIED_SAMPLING. Accepts the textual names "greedy", "top_p", ... */
MK_API mk_status mk_sampling_contract_init(mk_sampling_contract *out, mk_sampling_mode mode);
MK_API mk_status mk_sampling_contract_from_name(mk_sampling_contract *out, const char *mode);
MK_API const char *mk_sampling_mode_name(mk_sampling_mode mode);

/* ===================================================================== bundles == */

typedef enum mk_dtype {
    MK_DTYPE_F32 = 1,
    MK_DTYPE_F16 = 2,
    MK_DTYPE_BF16 = 3,
    MK_DTYPE_I32 = 4,
    MK_DTYPE_I64 = 5,
} mk_dtype;
MK_API size_t mk_dtype_size(mk_dtype dtype); /* 0 for an unknown dtype */
MK_API const char *mk_dtype_name(mk_dtype dtype);

#define MK_DIGEST_HEX_LEN 64 /* sha256 as lowercase hex */

/* The residual boundary between two ranges: the raw residual after layer next_layer-1,
 * every position row, unnormalized. Fields are public for reading; construct with
 * mk_bundle_create and release with mk_bundle_free. */
typedef struct mk_bundle {
    char architecture_adapter[32];   /* canonical adapter, "dense-llama" */
    uint32_t schema_version;         /* MK_BOUNDARY_SCHEMA_VERSION */
    char tensor_name[32];            /* "residual_stream" */
    char boundary_point[32];         /* MK_BOUNDARY_POINT */
    int64_t next_layer;              /* first layer that consumes this residual */
    bool normalized;                 /* always false for an emitted bundle */
    char recipe_digest[MK_DIGEST_HEX_LEN + 1];
    char request_id[64];             /* request / sequence id, may be "" */
    size_t batch, seq, hidden;
    float *residual;                 /* [batch, seq, hidden], owned */
    int32_t *positions;              /* [batch, seq], owned */
    void *storage_;                  /* private: the decoded message residual and positions
                                        live in after mk_bundle_unpack (no extra copy) */
} mk_bundle;

/* Allocate a bundle with zero-filled residual [batch, seq, hidden] and positions
 * [batch, seq]; metadata set to the dense-llama defaults, next_layer = 0. */
MK_API mk_status mk_bundle_create(size_t batch, size_t seq, size_t hidden, mk_bundle **out);
MK_API void mk_bundle_free(mk_bundle *bundle);
MK_API mk_status mk_bundle_clone(const mk_bundle *src, mk_bundle **out);

/* Serialize to protobuf bytes; *out is malloc'd, release with mk_buffer_free. */
MK_API mk_status mk_bundle_pack(const mk_bundle *bundle, uint8_t **out, size_t *out_len);
/* Serialize into a caller's buffer (e.g. pinned or registered memory) of `capacity`
 * bytes; mk_bundle_packed_size tells how many are needed. */
MK_API size_t mk_bundle_packed_size(const mk_bundle *bundle);
MK_API mk_status mk_bundle_pack_to(const mk_bundle *bundle, uint8_t *buffer, size_t capacity,
                                   size_t *out_len);
/* Parse protobuf bytes into a bundle, trusting no length, count or shape from the wire.
 * Checks schema version, architecture (after alias resolution), tensor name, boundary
 * point, dtype, byte order, shape, data length and positions shape. Model-dependent
 * checks (hidden width, recipe digest, seam) happen when a range accepts it. */
MK_API mk_status mk_bundle_unpack(const uint8_t *bytes, size_t len, mk_bundle **out);
MK_API void mk_buffer_free(void *buffer);

/* Named tensor fields of the bundle's residual, as on the wire. */
typedef struct mk_tensor_fields {
    const char *name;
    mk_dtype dtype;
    size_t rank;
    size_t shape[4];
    const char *byte_order; /* "little" or "big" */
} mk_tensor_fields;
MK_API mk_status mk_bundle_tensor_fields(const mk_bundle *bundle, mk_tensor_fields *out);

/* Protocol-level bundle for any architecture kind (dense/moe/mla): packs named F32
 * payloads and validates them; used to exercise architectures meshkern cannot run. */
typedef struct mk_named_payload {
    const char *name;
    const float *data; /* [count] */
    size_t count;
} mk_named_payload;
MK_API mk_status mk_protocol_bundle_pack(mk_protocol_arch arch, const mk_named_payload *payloads,
                                         size_t n_payloads, uint8_t **out, size_t *out_len);
/* Validate protocol bytes of any kind; fills *arch. Refuses missing required tensors. */
MK_API mk_status mk_protocol_bundle_validate(const uint8_t *bytes, size_t len,
                                             mk_protocol_arch *arch);

/* ================================================================= tail result == */

typedef struct mk_request_identity {
    const char *request_id;
    const char *runtime_recipe_digest;
    const char *chat_template_id;
    const char *chat_template_version;
    const char *reasoning_mode;
    mk_protocol_arch architecture;
} mk_request_identity;

typedef struct mk_sampling_params {
    float temperature;
    float top_p;
    int32_t top_k;
    uint64_t seed;
} mk_sampling_params; /* greedy is derived: temperature == 0 */

typedef enum mk_tail_output_kind {
    MK_TAIL_OUTPUT_TOKEN = 1,
    MK_TAIL_OUTPUT_LOGITS = 2,
} mk_tail_output_kind;

/* Build and validate a protobuf TailResult carrying exactly one output: a sampled token
 * id (>= 0) or a logits bundle [batch, vocab] F32. *out is malloc'd (mk_buffer_free). */
MK_API mk_status mk_tail_result_pack_token(const mk_request_identity *identity,
                                           const mk_sampling_params *sampling, int64_t token_id,
                                           uint8_t **out, size_t *out_len);
MK_API mk_status mk_tail_result_pack_logits(const mk_request_identity *identity,
                                            const mk_sampling_params *sampling,
                                            const float *logits /* [batch, vocab] */, size_t batch,
                                            size_t vocab, uint8_t **out, size_t *out_len);

typedef struct mk_tail_result_info {
    mk_tail_output_kind kind;
    int64_t token_id;       /* when kind == TOKEN */
    size_t batch, vocab;    /* when kind == LOGITS */
    bool greedy;
    mk_protocol_arch architecture;
    char request_id[128];
    char runtime_recipe_digest[MK_DIGEST_HEX_LEN + 1];
} mk_tail_result_info;
/* Parse and validate TailResult bytes (identity present, exactly one output). */
MK_API mk_status mk_tail_result_validate(const uint8_t *bytes, size_t len,
                                         mk_tail_result_info *out);

/* ====================================================================== models == */

typedef enum mk_rope_layout {
    MK_ROPE_ROTATE_HALF = 1,   /* pairs (i, i + head_dim/2): Hugging Face checkpoints */
    MK_ROPE_ADJACENT_PAIRS = 2 /* pairs (2i, 2i + 1): GGUF llama exports */
} mk_rope_layout;

typedef struct mk_hparams {
    size_t vocab;
    size_t hidden;
    size_t n_layers;
    size_t n_heads;
    size_t n_kv_heads;
    size_t head_dim;
    size_t intermediate;
    float rms_eps;
    float rope_theta;
    mk_rope_layout rope_layout;
    bool tied_embeddings;
    size_t max_context;
} mk_hparams;

/* The seed reference's shapes: vocab 48, hidden 32, 6 layers, 4 heads (4 kv heads),
 * head_dim 8, intermediate 64, eps 1e-6, theta 10000, rotate-half, untied, ctx 256. */
MK_API mk_hparams mk_hparams_seed_default(void);
MK_API mk_status mk_hparams_validate(const mk_hparams *hp);

typedef struct mk_model mk_model; /* opaque: description + weight source */

/* A seeded random model: weights N(0, 0.08^2), norms 1 + N(0, 0.02^2), generated per
 * tensor so a range materializes only its own layers. */
MK_API mk_status mk_model_create_random(const mk_hparams *hp, uint64_t seed, const char *architecture,
                                        mk_model **out);
/* Open a GGUF file (mmap, validated). general.architecture must be certified. */
MK_API mk_status mk_model_open_gguf(const char *path, mk_model **out);
MK_API void mk_model_free(mk_model *model);
MK_API const mk_hparams *mk_model_hparams(const mk_model *model);
MK_API const char *mk_model_architecture(const mk_model *model); /* as advertised */
/* Identity of the model's tensors and hyper-parameters (sha256 hex). */
MK_API const char *mk_model_digest(const mk_model *model);

/* =================================================================== backends == */

typedef enum mk_backend_kind { MK_BACKEND_CPU = 1, MK_BACKEND_CUDA = 2 } mk_backend_kind;

typedef struct mk_backend_config {
    mk_backend_kind kind;
    int device;            /* cuda device index */
    mk_dtype weight_dtype; /* F32 (default), F16, BF16 */
    bool speed_mode;       /* cuda: tensor-core GEMMs; false = parity mode (F32, no TF32) */
} mk_backend_config;

MK_API mk_backend_config mk_backend_config_default(mk_backend_kind kind);
MK_API mk_status mk_backend_kind_from_name(const char *name, mk_backend_kind *out);

/* ===================================================================== ranges == */

typedef struct mk_range mk_range; /* opaque: weights of [start, end], backend state */

typedef struct mk_range_options {
    const char *architecture;    /* advertised adapter; NULL = the model's */
    mk_backend_config backend;
    size_t max_context;          /* KV positions per sequence; 0 = min(model's, 4096) */
    size_t max_batch_tokens;     /* largest forward (rows); 0 = max_context */
} mk_range_options;

MK_API mk_range_options mk_range_options_default(void);
MK_API mk_status mk_range_create(const mk_model *model, int64_t start, int64_t end,
                                 const mk_range_options *options, mk_range **out);
MK_API void mk_range_free(mk_range *range);
MK_API mk_role mk_range_role(const mk_range *range);
MK_API int64_t mk_range_start(const mk_range *range);
MK_API int64_t mk_range_end(const mk_range *range);
/* Bytes of weights resident for this range (host or device). */
MK_API size_t mk_range_weight_bytes(const mk_range *range);
/* Recipe digest that bundles emitted/accepted by this range carry. */
MK_API const char *mk_range_recipe_digest(const mk_range *range);

/* Sequences: each has its own KV cache of max_context positions in every range. */
typedef struct mk_sequence mk_sequence;
MK_API mk_status mk_sequence_open(mk_range *range, mk_sequence **out);
MK_API void mk_sequence_close(mk_sequence *seq);
MK_API mk_status mk_sequence_reset(mk_sequence *seq);
MK_API size_t mk_sequence_length(const mk_sequence *seq); /* positions cached so far */

/* Tail output: last row only. */
typedef struct mk_tail_output {
    size_t batch, vocab;
    float *logits;       /* [batch, vocab], owned */
    int32_t *token_ids;  /* [batch], owned: sampled through the contract */
    mk_sampling_contract sampling;
} mk_tail_output;
MK_API void mk_tail_output_free(mk_tail_output *out);

/* One forward step of a sequence: exactly one of token_ids / bundle must be given, as
 * the range's role requires. Positions continue from the sequence's cache.
 * A non-tail range returns *out_bundle; a tail/full range returns *out_tail (sampled
 * through `sampling`, NULL = greedy). The unused out-pointer may be NULL. */
MK_API mk_status mk_range_forward(mk_range *range, mk_sequence *seq, const int32_t *token_ids,
                                  size_t n_tokens, const mk_bundle *bundle,
                                  const mk_sampling_contract *sampling, mk_bundle **out_bundle,
                                  mk_tail_output **out_tail);

/* ================================================================== pipelines == */

/* A model run as a chain of ranges in one process, one sequence in each range: the
 * single-node pipeline driver. cuts[i] is the last layer of range i (ascending); no cuts
 * is the whole model as one FULL range. With through_wire, every seam's bundle is packed
 * to protobuf bytes and unpacked by the next range, as between mesh peers. */
typedef struct mk_pipeline mk_pipeline;
MK_API mk_status mk_pipeline_create(const mk_model *model, const int64_t *cuts, size_t n_cuts,
                                    const mk_range_options *options, bool through_wire,
                                    mk_pipeline **out);
MK_API void mk_pipeline_free(mk_pipeline *pipeline);
MK_API size_t mk_pipeline_range_count(const mk_pipeline *pipeline);
MK_API mk_range *mk_pipeline_range(mk_pipeline *pipeline, size_t index);
/* Feed tokens to the head and carry the residual to the tail; *out is the tail output
 * (mk_tail_output_free). Prefill is many tokens, decode one. */
MK_API mk_status mk_pipeline_step(mk_pipeline *pipeline, const int32_t *tokens, size_t n_tokens,
                                  mk_tail_output **out);
MK_API mk_status mk_pipeline_reset(mk_pipeline *pipeline);
/* Bytes that crossed seams on the wire so far. */
MK_API size_t mk_pipeline_seam_bytes(const mk_pipeline *pipeline);


/* ========================================================= placed pipelines == */

/* The multi-device single-node pipeline: a model cut into ranges, each range on its own
 * device (cuda) or worker thread (cpu), many sequences in flight. Every stage has its own
 * host thread and its range's own stream; neighbouring stages are joined by a bounded
 * queue that carries the boundary of one micro-batch (one step of one sequence), so
 * while range i computes a step of sequence m, range i+1 computes a step of another.
 * Each range keeps a KV cache per sequence slot and each slot one preallocated
 * activation buffer per seam: a step allocates nothing on the in-process seam.
 * A sequence leaves on a stop id or its token limit and a queued one takes its slot. */

typedef struct mk_sched mk_sched;

/* How the boundary crosses each seam. */
typedef enum mk_sched_seam {
    MK_SCHED_SEAM_LOCAL = 0, /* handed over in process, no copy */
    MK_SCHED_SEAM_WIRE = 1,  /* packed to protobuf bytes and unpacked, as between peers */
} mk_sched_seam;

/* Called on the tail stage's thread for each generated token, in order per sequence;
 * `logits` [vocab] is valid only during the call. Must not call back into the mk_sched. */
typedef void (*mk_sched_token_fn)(void *user, uint64_t seq_id, size_t index, int32_t token, const float *logits,
                                  size_t vocab);

typedef struct mk_sched_options {
    size_t struct_size;        /* sizeof(mk_sched_options): set by mk_sched_options_default */
    mk_range_options range;    /* backend kind, weight dtype, max_context, max_batch_tokens
                                  (the longest prompt); backend.device comes from devices */
    const int64_t *cuts;       /* last layer of each range but the last (ascending) ... */
    size_t n_cuts;             /* ... or, with split_auto, ignored */
    bool split_auto;           /* balanced cuts for n_stages ranges (mk_split_auto) */
    size_t n_stages;           /* split_auto: ranges; 0 = n_devices (or 1) */
    const int *devices;        /* device of each range [n_devices]; NULL = range i on device i */
    size_t n_devices;
    size_t max_sequences;      /* sequences in flight (KV and activation slots); default 8 */
    mk_sched_seam seam;        /* default MK_SCHED_SEAM_LOCAL */
    mk_sched_token_fn on_token; /* optional */
    void *user;
    size_t timeline_capacity;  /* step records kept per stage for the timeline (later steps
                                  are not recorded); 0 = none */
} mk_sched_options;

MK_API mk_sched_options mk_sched_options_default(void);

/* Build the ranges on their devices and start one worker thread per stage. The model
 * must outlive the mk_sched. Release with mk_sched_free. */
MK_API mk_status mk_sched_create(const mk_model *model, const mk_sched_options *options, mk_sched **out);
/* Stop the workers (sequences still in flight are abandoned) and free every range. */
MK_API void mk_sched_free(mk_sched *sched);

MK_API size_t mk_sched_stage_count(const mk_sched *sched);
/* The range of stage i (owned by the mk_sched; do not forward through it while running). */
MK_API const mk_range *mk_sched_stage_range(const mk_sched *sched, size_t stage);
/* Stage i's share of the per-step cost the cuts were balanced on (sums to 1). */
MK_API double mk_sched_stage_share(const mk_sched *sched, size_t stage);

/* Queue a sequence: prompt [n_prompt] token ids (copied), at most max_new_tokens
 * generated, stopping early after any id in stop_ids [n_stop] (copied; e.g. the model's
 * end-of-generation ids). *seq_id names it in the calls below. */
MK_API mk_status mk_sched_submit(mk_sched *sched, const int32_t *prompt, size_t n_prompt, size_t max_new_tokens,
                                 const int32_t *stop_ids, size_t n_stop, uint64_t *seq_id);

typedef enum mk_seq_state {
    MK_SEQ_QUEUED = 1,  /* waiting for a slot */
    MK_SEQ_RUNNING = 2,
    MK_SEQ_DONE = 3,    /* stopped on a stop id or its token limit */
    MK_SEQ_FAILED = 4,  /* status and error say why; tokens so far are kept */
} mk_seq_state;

typedef struct mk_seq_info {
    mk_seq_state state;
    mk_status status;   /* MK_OK unless FAILED */
    size_t n_tokens;    /* generated so far */
    bool stopped;       /* DONE on a stop id (false: on the token limit) */
    const char *error;  /* when FAILED: the stage, its layers and the cause; valid until
                           mk_sched_free ("" otherwise) */
} mk_seq_info;

/* A sequence's state and up to `cap` of its generated tokens (tokens may be NULL). */
MK_API mk_status mk_sched_poll(mk_sched *sched, uint64_t seq_id, mk_seq_info *info, int32_t *tokens, size_t cap);
/* Block until the sequence is DONE or FAILED (the workers always finish one). */
MK_API mk_status mk_sched_wait(mk_sched *sched, uint64_t seq_id);
/* Block until every submitted sequence is DONE or FAILED. */
MK_API mk_status mk_sched_wait_all(mk_sched *sched);

typedef struct mk_stage_stats {
    size_t steps;          /* forwards run */
    uint64_t busy_ns;      /* time inside them */
    uint64_t cpu_ns;       /* CPU time the stage's thread spent inside them (less than
                              busy_ns when other processes share the cores) */
    uint64_t first_ns;     /* start of the first, end of the last (CLOCK_MONOTONIC) */
    uint64_t last_ns;
} mk_stage_stats;
MK_API mk_status mk_sched_stage_stats(const mk_sched *sched, size_t stage, mk_stage_stats *out);
/* Clear the statistics and the timeline; call while no sequence is in flight. */
MK_API mk_status mk_sched_reset_stats(mk_sched *sched);
/* The stage timeline as JSON: {"stages":N,"steps":[{"stage":i,"seq":id,"rows":r,
 * "start_us":t0,"end_us":t1},...]} with times from the earliest start. *out is malloc'd
 * (mk_buffer_free). */
MK_API mk_status mk_sched_timeline_json(const mk_sched *sched, char **out, size_t *out_len);

/* Balanced cuts: per-layer cost is the weight elements a decode step reads; the head
 * adds one embedding row per token, the tail the final norm and the lm_head. Picks the
 * n_stages - 1 cuts (last layer of each range but the last) that minimise the largest
 * stage cost; shares [n_stages] (may be NULL) receive each stage's fraction. */
MK_API mk_status mk_split_auto(const mk_model *model, size_t n_stages, int64_t *cuts, double *shares);

#ifdef __cplusplus
}
#endif
#endif /* MESHKERN_H */
