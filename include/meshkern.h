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
    MK_ERR_KV_POOL_FULL = 29,          /* the range's KV block pool cannot hold the positions asked */
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
    MK_ERR_MPI = 87,                   /* an MPI call failed (launch by mpirun) */
    /* seams and transports (host/seam/) */
    MK_ERR_PEER_CLOSED = 90,           /* the peer closed the connection (mid-frame or before) */
    MK_ERR_PEER_TIMEOUT = 91,          /* connect, read or write passed its deadline */
    MK_ERR_AUTH = 92,                  /* TLS handshake refused: wrong key/cert or plaintext peer */
    MK_ERR_FRAME = 93,                 /* bad frame magic/version, or a length over the receiver's limit */
    MK_ERR_NONFINITE = 94,             /* a received residual, or a model weight at load, carries NaN or Inf */
    MK_ERR_CONNECT = 95,               /* address unusable or nobody listening */
    MK_ERR_PEER_LOST = 96,             /* a stage process died or left mid-run (its connection closed) */
    /* text: tokenizer and chat template */
    MK_ERR_TOKENIZER = 100,            /* tokenizer metadata missing, unknown or inconsistent */
    MK_ERR_INVALID_UTF8 = 101,         /* text to encode is not valid UTF-8 */
    MK_ERR_CHAT_TEMPLATE = 102,        /* chat template absent or not recognised, bad roles */
} mk_status;

/* Symbolic name of a status ("MK_ERR_SEAM_MISMATCH"); never NULL. */
MK_API const char *mk_status_name(mk_status status);
/* Message of the last failure on this thread ("" if none). Valid until the next call
 * into meshkern on this thread.
 * Every call that can fail (each one returning an mk_status, and mk_bundle_packed_size and
 * mk_bundle_payload_offset, which return 0 on failure) clears the message on entry, so after
 * a failure the message is that failure's own, never one left by an earlier call. Calls
 * that cannot fail (names, getters, *_default, the free functions) leave it alone:
 * cleaning up, or naming the status, or reading a figure before reading the message keeps
 * it. tests/api_surface_check.py reads the list above. */
MK_API const char *mk_last_error(void);

/* ====================================================== architecture registry == */

#define MK_DENSE_LLAMA_ADAPTER "dense-llama"
#define MK_RESIDUAL_TENSOR_NAME "residual_stream"
#define MK_BOUNDARY_SCHEMA_VERSION 1u        /* one sequence per bundle */
#define MK_BOUNDARY_BATCH_SCHEMA_VERSION 2u  /* a batch: the rows of several sequences, one entry each */
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
    /* Weights only: each tensor kept in the format its GGUF file stores (Q4_1, Q8_0, ...)
     * on backends that compute on it (cpu); never a bundle dtype. mk_dtype_size is 0. */
    MK_DTYPE_NATIVE = 6,
} mk_dtype;
MK_API size_t mk_dtype_size(mk_dtype dtype); /* 0 for an unknown dtype */
MK_API const char *mk_dtype_name(mk_dtype dtype);

#define MK_DIGEST_HEX_LEN 64 /* sha256 as lowercase hex */

/* The header of a boundary between two ranges: everything the contract checks, small
 * enough to travel ahead of the payload (a frame, an NCCL send) and be validated before
 * any payload is accepted. Plain data: copy it freely. */
typedef struct mk_boundary_header {
    uint32_t schema_version;          /* MK_BOUNDARY_SCHEMA_VERSION */
    mk_protocol_arch architecture;    /* MK_PROTOCOL_ARCH_DENSE */
    char adapter[32];                 /* canonical adapter, "dense-llama" */
    char tensor_name[32];             /* "residual_stream" */
    char boundary_point[32];          /* MK_BOUNDARY_POINT */
    int64_t next_layer;               /* first layer that consumes this residual */
    bool normalized;                  /* always false for an emitted boundary */
    char recipe_digest[MK_DIGEST_HEX_LEN + 1];
    char request_id[64];              /* request / sequence id, may be "" */
    size_t batch;                     /* 1: one sequence */
    size_t rows;                      /* positions carried (seq) */
    size_t hidden;
    mk_dtype dtype;                   /* MK_DTYPE_F32 */
    uint64_t step;                    /* forward count of the producing sequence (0 = prefill) */
    int64_t position;                 /* position of the first row; rows continue it */
} mk_boundary_header;

/* A boundary in host memory: header + residual [batch, rows, hidden] F32 + positions
 * [batch, rows] I32. Opaque; the protobuf TensorBundle is its wire encoding. Construct
 * with mk_bundle_create, release with mk_bundle_free. */
typedef struct mk_bundle mk_bundle;

/* Allocate a bundle with zero-filled residual [batch, seq, hidden] and positions
 * [batch, seq]; metadata set to the dense-llama defaults, next_layer = 0. */
MK_API mk_status mk_bundle_create(size_t batch, size_t seq, size_t hidden, mk_bundle **out);
MK_API void mk_bundle_free(mk_bundle *bundle);
MK_API mk_status mk_bundle_clone(const mk_bundle *src, mk_bundle **out);
/* Accessors. The header and arrays belong to the bundle (valid until mk_bundle_free). */
MK_API const mk_boundary_header *mk_bundle_header_of(const mk_bundle *bundle);
MK_API float *mk_bundle_residual(mk_bundle *bundle);     /* [batch, rows, hidden] */
MK_API int32_t *mk_bundle_positions(mk_bundle *bundle);  /* [batch, rows] */
MK_API const float *mk_bundle_residual_const(const mk_bundle *bundle);
MK_API const int32_t *mk_bundle_positions_const(const mk_bundle *bundle);
/* Replace the header's identity fields (everything but batch, rows, hidden and dtype,
 * which describe the arrays and must be unchanged: MK_ERR_SHAPE otherwise). Each string
 * field must end with a NUL inside its array (MK_ERR_INVALID_ARGUMENT otherwise). */
MK_API mk_status mk_bundle_set_header(mk_bundle *bundle, const mk_boundary_header *header);

/* Serialize to protobuf bytes; *out is malloc'd, release with mk_buffer_free. */
MK_API mk_status mk_bundle_pack(const mk_bundle *bundle, uint8_t **out, size_t *out_len);
/* Serialize into a caller's buffer (e.g. pinned or registered memory) of `capacity`
 * bytes; mk_bundle_packed_size tells how many are needed. */
MK_API size_t mk_bundle_packed_size(const mk_bundle *bundle);
/* Where the residual's bytes start inside the packed message: place the buffer so that
 * buffer + offset is 64-byte aligned and pack_to / unpack_into copy at memcpy speed. */
MK_API size_t mk_bundle_payload_offset(const mk_bundle *bundle);
MK_API mk_status mk_bundle_pack_to(const mk_bundle *bundle, uint8_t *buffer, size_t capacity,
                                   size_t *out_len);
/* Parse protobuf bytes into a bundle, trusting no length, count or shape from the wire.
 * Checks schema version, architecture (after alias resolution), tensor name, boundary
 * point, dtype, byte order, shape, data length and positions shape. Model-dependent
 * checks (hidden width, recipe digest, seam) happen when a range accepts it. */
MK_API mk_status mk_bundle_unpack(const uint8_t *bytes, size_t len, mk_bundle **out);
/* The same checks (and positions must count up from the first row), decoding into an
 * existing bundle reused across steps, so no message lands on fresh pages. The payload is
 * copied once, from `bytes` into the bundle's arrays, which must hold the message's
 * rows x hidden (MK_ERR_SHAPE otherwise); the header is replaced. */
MK_API mk_status mk_bundle_unpack_into(const uint8_t *bytes, size_t len, mk_bundle *into);
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

/* Largest head_dim a model may have (mk_hparams_validate refuses more): the kernels keep
 * a head's row in shared memory and registers. */
#define MK_MAX_HEAD_DIM 256

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

/* ================================================================== tokenizer == */

/* The model's own tokenizer, read from the GGUF `tokenizer.ggml.*` metadata:
 *   "gpt2"  byte-level BPE (merges by rank) with the pre-tokenizer named by
 *           tokenizer.ggml.pre: "smollm" (digits one by one, then the GPT-2 rule),
 *           "llama-bpe" / "llama3" / "llama-v3" (Llama-3), "gpt2" / "default" (GPT-2);
 *   "llama" SentencePiece (scores, U+2581 for spaces, space prefix, <0xXX> byte fallback).
 * Special tokens (control, user-defined) are split out of the text first, longest first.
 * Anything else fails with MK_ERR_TOKENIZER naming the value. The tokenizer copies what it
 * needs: it does not borrow the model, which may be freed first. One tokenizer may be
 * used from several threads at once (encode and decode keep their state per call). */
typedef struct mk_tokenizer mk_tokenizer;

MK_API mk_status mk_tokenizer_open(const mk_model *model, mk_tokenizer **out);
/* Only the tokenizer of a GGUF file (no weights are read or checked). */
MK_API mk_status mk_tokenizer_open_file(const char *gguf_path, mk_tokenizer **out);
MK_API void mk_tokenizer_free(mk_tokenizer *tok);

MK_API size_t mk_tokenizer_vocab_size(const mk_tokenizer *tok);
MK_API int32_t mk_tokenizer_bos(const mk_tokenizer *tok); /* -1 when the model has none */
MK_API int32_t mk_tokenizer_eos(const mk_tokenizer *tok); /* -1 when the model has none */
/* End of generation: EOS, EOT, EOM and the end-of-turn control tokens (<|im_end|>,
 * <|eot_id|>, <|endoftext|>, ...). False for ids outside the vocabulary. */
MK_API bool mk_tokenizer_is_eog(const mk_tokenizer *tok, int32_t token);
/* Token text as stored in the vocabulary (byte-level or U+2581 form), NUL-terminated,
 * owned by the tokenizer; NULL outside the vocabulary. */
MK_API const char *mk_tokenizer_token_text(const mk_tokenizer *tok, int32_t token);

/* Flags of mk_tokenizer_encode. */
#define MK_TOKENIZE_ADD_SPECIAL 1u   /* add BOS / EOS as the model's add_bos/add_eos say */
#define MK_TOKENIZE_PARSE_SPECIAL 2u /* control-token text ("<|im_end|>") becomes its id */

/* Encode `len` bytes of UTF-8 text. Invalid UTF-8 fails with MK_ERR_INVALID_UTF8 and the
 * byte offset. *out_ids is malloc'd (release with mk_buffer_free; NULL when *out_n is 0). */
MK_API mk_status mk_tokenizer_encode(const mk_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t **out_ids, size_t *out_n);
/* Number of tokens mk_tokenizer_encode would return. */
MK_API mk_status mk_tokenizer_count(const mk_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                    size_t *out_n);

/* Flags of decoding. */
#define MK_DECODE_SPECIAL 1u /* render control tokens as their text (default: nothing) */

/* Decode ids to bytes, exactly as the pieces concatenate (so decode(encode(s)) == s for
 * valid s); the SentencePiece space prefix is removed from the start. *out is malloc'd,
 * NUL-terminated (release with mk_buffer_free). Ids outside the vocabulary fail with
 * MK_ERR_TOKEN_OUT_OF_RANGE. */
MK_API mk_status mk_tokenizer_decode(const mk_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                     char **out, size_t *out_len);

/* Streaming decode for generation: each pushed token yields the text that is complete so
 * far; bytes of a UTF-8 sequence that a token leaves unfinished are held until the tokens
 * that finish it arrive. Output is always valid UTF-8 (a broken sequence becomes U+FFFD). */
typedef struct mk_detokenizer mk_detokenizer;
MK_API mk_status mk_detokenizer_create(const mk_tokenizer *tok, unsigned flags, mk_detokenizer **out);
MK_API void mk_detokenizer_free(mk_detokenizer *d);
/* *text (not NUL-terminated, *len bytes, possibly 0) is owned by d, valid until its next call. */
MK_API mk_status mk_detokenizer_push(mk_detokenizer *d, int32_t token, const char **text, size_t *len);
/* End of stream: held bytes of an unfinished sequence come out as U+FFFD; d starts afresh. */
MK_API mk_status mk_detokenizer_flush(mk_detokenizer *d, const char **text, size_t *len);

/* ============================================================== chat template == */

/* The chat shapes meshkern renders, recognised from tokenizer.chat_template's text. */
typedef enum mk_chat_template_kind {
    MK_CHAT_TEMPLATE_CHATML = 1, /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
    MK_CHAT_TEMPLATE_LLAMA3 = 2, /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    MK_CHAT_TEMPLATE_LLAMA2 = 3, /* <s>[INST] <<SYS>>...<</SYS>> ... [/INST] answer </s> */
} mk_chat_template_kind;

typedef struct mk_chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* UTF-8 */
} mk_chat_message;

/* Which shape the model's template has; MK_ERR_CHAT_TEMPLATE (naming the template's start)
 * when it is absent or not one of the shapes above. */
MK_API mk_status mk_chat_template_detect(const mk_tokenizer *tok, mk_chat_template_kind *out);
MK_API const char *mk_chat_template_name(mk_chat_template_kind kind);
/* Render a conversation as the model's template does (with its BOS text and default
 * system prompt, if any), plus the assistant header when add_generation_prompt. Encode
 * the result with MK_TOKENIZE_PARSE_SPECIAL and without MK_TOKENIZE_ADD_SPECIAL.
 * *out is malloc'd, NUL-terminated (mk_buffer_free). */
MK_API mk_status mk_chat_apply(const mk_tokenizer *tok, const mk_chat_message *messages, size_t n_messages,
                               bool add_generation_prompt, char **out, size_t *out_len);
/* The conversation rendered as mk_chat_apply renders it and encoded as the model reads it:
 * the template's own markup with its control tokens, each message's content as plain text.
 * A control token's text inside a content ("<|im_end|>", "<|start_header_id|>") stays text,
 * so a message cannot end its turn or open another (OpenAI's API and tiktoken treat content
 * so; encoding mk_chat_apply's text with MK_TOKENIZE_PARSE_SPECIAL would turn it into the
 * token). The same ids as that encoding wherever no content holds such text. *ids is
 * malloc'd (mk_buffer_free). */
MK_API mk_status mk_chat_encode(const mk_tokenizer *tok, const mk_chat_message *messages, size_t n_messages,
                                bool add_generation_prompt, int32_t **ids, size_t *n_ids);

/* =================================================================== backends == */

typedef enum mk_backend_kind { MK_BACKEND_CPU = 1, MK_BACKEND_CUDA = 2 } mk_backend_kind;

/* Option structs (mk_backend_config, mk_range_options, mk_seam_options, mk_pipeline_options,
 * mk_sched_options, mk_stage_options) are versioned by their first field,
 * struct_size, which their *_default() function sets to the size of the struct the caller
 * was compiled with. Always start from *_default() and then change fields: later versions
 * of meshkern only append fields, read just the struct_size bytes a caller has, and give
 * the fields it lacks their defaults. A struct_size meshkern does not know (0 from a
 * struct not made by *_default(), or one larger than its own) is refused with
 * MK_ERR_INVALID_ARGUMENT. mk_backend_config is embedded in mk_range_options, so it never
 * grows: a later backend setting is appended to mk_range_options instead. */
typedef struct mk_backend_config {
    size_t struct_size;    /* sizeof(mk_backend_config), set by mk_backend_config_default */
    mk_backend_kind kind;
    int device;            /* cuda device index */
    mk_dtype weight_dtype; /* F32 (default), F16, BF16, or NATIVE (cpu) */
    bool speed_mode;       /* cuda: tensor-core GEMMs; false = parity mode (F32, no TF32) */
    size_t threads;        /* cpu: threads for native matrix products; 0 = every core this
                            * process may run on. Results do not depend on it. */
    mk_dtype kv_dtype;     /* KV cache elements: F32 (default; 0 also means F32), F16, or BF16 (cuda) */
} mk_backend_config;

MK_API mk_backend_config mk_backend_config_default(mk_backend_kind kind);
MK_API mk_status mk_backend_kind_from_name(const char *name, mk_backend_kind *out);

/* ===================================================================== ranges == */

typedef struct mk_range mk_range; /* opaque: weights of [start, end], backend state */

/* Versioned by struct_size like mk_backend_config (see there). */
typedef struct mk_range_options {
    size_t struct_size;          /* sizeof(mk_range_options), set by mk_range_options_default */
    const char *architecture;    /* advertised adapter; NULL = the model's */
    mk_backend_config backend;
    size_t max_context;          /* KV positions per sequence; 0 = min(model's, 4096) */
    size_t max_batch_tokens;     /* largest forward (rows); 0 = max_context */
    /* Tail/full range: a step samples on the backend and brings back only the token id (4
     * bytes, one host wait per step on the cuda backend); mk_tail_output.logits is then
     * NULL (and a generation callback gets logits == NULL). false (the default): the
     * logits [vocab] come back too. */
    bool token_only;
    /* A decode step (one row of one sequence, or a batch of decode rows of many) on a
     * backend with graphs (cuda) replays a CUDA graph recorded once per bucket of rows (1,
     * 2, 4, ... up to max_batch_sequences): one launch per range and step, no host work
     * between kernels, whatever the sequences, their blocks or the boundary buffers. A step
     * that cannot be recorded runs op by op.
     * true: every step runs op by op (eager), for comparisons and debugging. Results are
     * bit-identical either way. Default false. */
    bool eager_decode;
    /* Sequences one forward may carry (mk_range_forward_batch), at most
     * MK_MAX_BATCH_SEQUENCES and at most max_batch_tokens; 0 = 1. The tail keeps a row of
     * logits per sequence. */
    size_t max_batch_sequences;
    /* The paged KV cache: one pool of blocks per range, every layer's keys and values of
     * kv_block_size positions in a block (a power of two from 4 to 1024; 0 = 16). Its size in
     * blocks, or in bytes (whole blocks; kv_pool_blocks wins when both are set); both 0 = room
     * for max(max_batch_sequences, 4) sequences of max_context positions. A sequence takes
     * blocks as its positions fill and gives them back at reset or close, so sequences of any
     * length share the pool. A forward that needs a block the pool no longer has fails with
     * MK_ERR_KV_POOL_FULL before anything runs, unless its sequence reserved the block
     * (mk_sequence_reserve): a reserved block is never given to another sequence. */
    size_t kv_block_size;
    size_t kv_pool_blocks;
    size_t kv_pool_bytes;
} mk_range_options;
#define MK_MAX_BATCH_SEQUENCES 64

MK_API mk_range_options mk_range_options_default(void);
MK_API mk_status mk_range_create(const mk_model *model, int64_t start, int64_t end,
                                 const mk_range_options *options, mk_range **out);
MK_API void mk_range_free(mk_range *range);
/* The getters below read a NULL range (mk_pipeline_range past the end) as no range: role 0,
 * start and end -1, 0 bytes, a NULL digest. */
MK_API mk_role mk_range_role(const mk_range *range);
MK_API int64_t mk_range_start(const mk_range *range);
MK_API int64_t mk_range_end(const mk_range *range);
/* Bytes of weights resident for this range (host or device). */
MK_API size_t mk_range_weight_bytes(const mk_range *range);
/* Recipe digest that bundles emitted/accepted by this range carry. */
MK_API const char *mk_range_recipe_digest(const mk_range *range);
/* Why this range stopped recording decode steps as CUDA graphs: NULL while it records them
 * (or never tried: eager_decode, a backend without graphs), else the status and message of
 * the recording that failed; that step and every later one ran op by op, with the same
 * results. Owned by the range. */
MK_API const char *mk_range_graph_failure(const mk_range *range);

/* Sequences: each holds up to max_context positions in its range's KV pool, block by block
 * as they fill. Opening takes no block; reset and close give every block back.
 * Threads: a range's forwards (every form, whichever of its sequences) share its activations,
 * so they come from one thread at a time, and a sequence is used by one thread at a time (no
 * reset, reserve or close during its forward): the caller serializes them. Different ranges
 * run on different threads at once, and the KV pool is locked: reserve, reset or close a
 * sequence that is not in a forward, and mk_range_kv_pool, from any thread. */
typedef struct mk_sequence mk_sequence;
MK_API mk_status mk_sequence_open(mk_range *range, mk_sequence **out);
MK_API void mk_sequence_close(mk_sequence *seq);
MK_API mk_status mk_sequence_reset(mk_sequence *seq);
MK_API size_t mk_sequence_length(const mk_sequence *seq); /* positions cached so far */
/* Promise the sequence room for `positions` positions in all (at most max_context): the
 * blocks it lacks are set aside in the pool, so its forwards up to that length never fail
 * for want of a block. MK_ERR_KV_POOL_FULL (nothing set aside) when the pool's free blocks
 * not promised to others are too few. Asking for less than already promised changes
 * nothing; reset and close drop the promise. */
MK_API mk_status mk_sequence_reserve(mk_sequence *seq, size_t positions);
/* The range's KV pool, for admission decisions and accounting. */
typedef struct mk_kv_pool_info {
    size_t block_size;      /* positions per block */
    size_t block_bytes;     /* one block: keys and values of every layer of the range */
    size_t blocks;          /* in the pool */
    size_t free_blocks;     /* held by no sequence */
    size_t promised_blocks; /* of the free ones, promised to sequences (mk_sequence_reserve) */
} mk_kv_pool_info;
MK_API mk_status mk_range_kv_pool(const mk_range *range, mk_kv_pool_info *info);

/* Tail output: last row only. */
typedef struct mk_tail_output {
    size_t batch, vocab;
    float *logits;       /* [batch, vocab], owned; NULL when the range is token_only */
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

/* ================================================================= boundaries == */

/* A boundary whose payload stays in a range's backend memory (a device buffer on cuda):
 * the form a seam transport moves. Capacity: the range's max_batch_tokens rows of its
 * hidden width. Created for one range, used as that range's output or input; released
 * with mk_boundary_free before the range. */
typedef struct mk_boundary mk_boundary;
MK_API mk_status mk_boundary_create(mk_range *range, mk_boundary **out);
MK_API void mk_boundary_free(mk_boundary *boundary);
/* The header of the boundary's current contents (rows == 0 while empty); owned by the
 * boundary. mk_bundle_header_of is the same for a bundle in host memory (both end in _of:
 * mk_boundary_header is the type's name). */
MK_API const mk_boundary_header *mk_boundary_header_of(const mk_boundary *boundary);
MK_API mk_range *mk_boundary_range(const mk_boundary *boundary);
/* Name the sequence the boundary's rows belong to (request id, at most 63 bytes) and its
 * step, as a batch's entries need (mk_seam_send_batch). A forward writes a fresh header (no
 * request id, the sequence's own step): name it after the forward that fills it. */
MK_API mk_status mk_boundary_set_request(mk_boundary *boundary, const char *request_id, uint64_t step);
/* Copy the payload to host memory: residual [rows, hidden] (waits for the range's stream). */
MK_API mk_status mk_boundary_read(const mk_boundary *boundary, float *residual, size_t capacity_floats);

/* The boundary contract on a header alone, exactly as the range applies it before any
 * payload is accepted: role, normalized flag, schema version, architecture, tensor name,
 * boundary point, next_layer, recipe digest, hidden width, dtype, rows within the range's
 * max_batch_tokens and the sequence's context, first position continuing the sequence. */
MK_API mk_status mk_range_check_boundary(const mk_range *range, const mk_sequence *seq,
                                         const mk_boundary_header *header);

/* mk_range_forward with boundaries in backend memory: `in` (a boundary of this range,
 * validated and filled by a transport) or token ids; a non-tail range writes its raw
 * residual into `out` (a boundary of this range), a tail range returns *out_tail. */
MK_API mk_status mk_range_forward_boundary(mk_range *range, mk_sequence *seq, const int32_t *token_ids,
                                           size_t n_tokens, const mk_boundary *in,
                                           const mk_sampling_contract *sampling, mk_boundary *out,
                                           mk_tail_output **out_tail);

/* ====================================================================== seams == */

/* How the boundary crosses a seam:
 *   LOCAL  same process: device-to-device copy into the receiver's buffer (memcpy on cpu)
 *   WIRE   same process: the TensorBundle packed to bytes and unpacked (host-staged)
 *   UNIX   a Unix-domain stream socket: pinned staging -> TensorBundle -> framed bytes
 *   TCP    the same over TCP (loopback unless an address says otherwise)
 *   NCCL   GPU to GPU (cuda backend on both ends, distinct devices): the header as a
 *          512-byte NCCL send checked by the receiver's contract before the payload
 *          receive is posted into its device buffer; payload device-to-device on the
 *          ranges' streams. In one process mk_seam_pair builds a two-rank communicator;
 *          across processes the listener's address is a file through which the unique id
 *          is handed over (mk_seam_listen writes it, mk_seam_connect reads it). Builds
 *          without NCCL refuse it with MK_ERR_UNSUPPORTED. */
typedef enum mk_seam_kind { MK_SEAM_LOCAL = 1, MK_SEAM_WIRE, MK_SEAM_UNIX, MK_SEAM_TCP, MK_SEAM_NCCL } mk_seam_kind;
MK_API mk_status mk_seam_kind_from_name(const char *name, mk_seam_kind *out);
MK_API const char *mk_seam_kind_name(mk_seam_kind kind);

typedef struct mk_seam_tls {
    bool enabled;
    /* TLS 1.3 external pre-shared key (hex, >= 32 bytes) and its identity; or
     * certificates: this end's cert + key (PEM files) and the CA that signs the peer's. */
    const char *psk_hex;
    const char *psk_identity;   /* NULL = "meshkern" */
    const char *cert_file, *key_file, *ca_file;
} mk_seam_tls;

/* Versioned by struct_size like mk_backend_config (see there). */
typedef struct mk_seam_options {
    size_t struct_size;         /* sizeof(mk_seam_options), set by mk_seam_options_default */
    mk_seam_kind kind;
    /* UNIX: a socket path (NULL in mk_seam_pair: an unnamed socketpair). TCP: "HOST:PORT";
     * a listener binds 127.0.0.1 unless HOST says otherwise (port 0: any free port). */
    const char *address;
    int connect_timeout_ms;     /* 0 = 5000 */
    int io_timeout_ms;          /* per frame read or write; 0 = 30000 (a frame's body may not
                                 * stall for more than a quarter of it) */
    mk_seam_tls tls;
} mk_seam_options;
MK_API mk_seam_options mk_seam_options_default(mk_seam_kind kind);

/* One end of a seam. A sending end belongs to the range that produces the boundary, a
 * receiving end to the range that consumes it: the receiver's limits (hidden width,
 * max_batch_tokens) bound what it reads, never the sender's word. */
typedef struct mk_seam mk_seam;
typedef struct mk_seam_listener mk_seam_listener;

/* Both ends in this process (local, wire, or a stream over a socketpair / loopback TCP
 * connection). The ranges may sit on different devices. Free both with mk_seam_free. */
MK_API mk_status mk_seam_pair(const mk_seam_options *options, mk_range *sender, mk_range *receiver,
                              mk_seam **send_end, mk_seam **recv_end);
/* Stream ends across processes: listen (bound before return), accept one sender within
 * the connect deadline; or connect to a listener. */
MK_API mk_status mk_seam_listen(const mk_seam_options *options, mk_seam_listener **out);
/* The bound address ("127.0.0.1:40123", or the socket path); owned by the listener. */
MK_API const char *mk_seam_listener_address(const mk_seam_listener *listener);
MK_API mk_status mk_seam_accept(mk_seam_listener *listener, mk_range *receiver, mk_seam **out);
MK_API void mk_seam_listener_free(mk_seam_listener *listener);
MK_API mk_status mk_seam_connect(const mk_seam_options *options, mk_range *sender, mk_seam **out);
MK_API void mk_seam_free(mk_seam *seam);

/* Send a boundary of the sending range. Stream transports stage and pack on the calling
 * thread and write from the seam's own I/O thread: the call returns once the frame is
 * handed over; mk_seam_send_wait gives the write's status (the next send waits too). The
 * local seam hands the receiver the sent boundary itself: keep it alive and unchanged until
 * the receiving end has received it. */
MK_API mk_status mk_seam_send(mk_seam *seam, const mk_boundary *boundary);
MK_API mk_status mk_seam_send_wait(mk_seam *seam);
/* Send the boundaries of n sequences (1 to MK_MAX_BATCH_SEQUENCES, rows adding up to at
 * most the range's max_batch_tokens) as one message: a TensorBundle of schema version 2
 * with an entry per sequence (request id, step, position, rows), one frame on a stream.
 * The boundaries must agree on what the entries share (next_layer, digest, width) and
 * carry distinct, non-empty request ids. n == 1 sends what mk_seam_send sends. The nccl
 * seam carries one sequence per message (n > 1: MK_ERR_UNSUPPORTED). */
MK_API mk_status mk_seam_send_batch(mk_seam *seam, const mk_boundary *const *boundaries, size_t n);
/* Receive into a boundary of the receiving range, for `seq` (a sequence of that range: one of
 * another is refused before anything is received, so the message waits for the next call): the
 * header is checked with mk_range_check_boundary before the payload is accepted; residuals with
 * NaN/Inf are refused (MK_ERR_NONFINITE) on host-staged transports. */
MK_API mk_status mk_seam_recv(mk_seam *seam, const mk_sequence *seq, mk_boundary *into);
/* The sequence a received batch entry belongs to (NULL: none; the entry is refused). */
typedef const mk_sequence *(*mk_seam_route)(void *user, const mk_boundary_header *entry);
/* Receive the next message, a single boundary or a batch, into into[0..capacity): entry k
 * goes to into[k] once route(user, its header) names its sequence and the contract
 * (mk_range_check_boundary) passes; *n_received entries came. An entry refused (no
 * sequence, the contract, NaN/Inf) fails alone: entry_status[k] says why (mk_last_error:
 * the first refused entry's message), into[k] stays empty, the others are received. The
 * call fails only where the message itself is bad or lost (then nothing was accepted). */
MK_API mk_status mk_seam_recv_batch(mk_seam *seam, mk_seam_route route, void *user, mk_boundary *const *into,
                                    size_t capacity, size_t *n_received, mk_status *entry_status);
/* Bytes moved and seconds spent in send + recv on this end. */
MK_API size_t mk_seam_bytes(const mk_seam *seam);
MK_API double mk_seam_seconds(const mk_seam *seam);

/* ================================================================== pipelines == */

/* A model run as a chain of ranges in one process, one sequence in each range: the
 * single-node pipeline driver. Every seam carries the boundary over one transport of the
 * seams API (mk_seam_kind: LOCAL, a device-to-device copy, by default; WIRE packs every
 * boundary to protobuf bytes and unpacks it in the next range, as between mesh peers).
 * Seam time and bytes: mk_pipeline_seam_seconds, mk_pipeline_seam_bytes. */
typedef struct mk_pipeline mk_pipeline;

/* Versioned by struct_size like mk_backend_config (see there). The range and seam options
 * are pointed to, not embedded, so each keeps its own struct_size and may grow. */
typedef struct mk_pipeline_options {
    size_t struct_size;             /* sizeof(mk_pipeline_options), set by mk_pipeline_options_default */
    const mk_range_options *range;  /* every range's options; NULL = mk_range_options_default() */
    const int64_t *cuts;            /* last layer of each range but the last (ascending) [n_cuts];
                                       no cuts: the whole model as one FULL range */
    size_t n_cuts;
    const mk_seam_options *seam;    /* every seam's transport; NULL = mk_seam_options_default(MK_SEAM_LOCAL) */
    const int *devices;             /* device of each range [n_devices] (n_devices == n_cuts + 1), which
                                       replaces range->backend.device; NULL: every range on that device */
    size_t n_devices;
} mk_pipeline_options;
MK_API mk_pipeline_options mk_pipeline_options_default(void);

/* Build the ranges, a sequence in each and the seams between them. The model must outlive
 * the pipeline; release with mk_pipeline_free. */
MK_API mk_status mk_pipeline_create(const mk_model *model, const mk_pipeline_options *options, mk_pipeline **out);
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
/* Seconds spent carrying boundaries across the seams (send + receive) so far. */
MK_API double mk_pipeline_seam_seconds(const mk_pipeline *pipeline);
/* Wall-clock seconds spent in range `index` (its forward passes, and for a range after a
 * seam, receiving the bundle) over all steps so far; 0 for an index past the end. */
MK_API double mk_pipeline_range_seconds(const mk_pipeline *pipeline, size_t index);

/* ================================================================= generation == */

typedef struct mk_generate_stats {
    size_t n_prompt;      /* prompt tokens fed */
    size_t n_generated;   /* tokens handed to the callback (the end-of-generation one excluded) */
    bool stopped_at_eog;  /* true: an end-of-generation token came; false: max_new reached */
    int32_t eog_token;    /* that token, or -1 */
    double prefill_s;     /* the prompt's forward pass */
    double decode_s;      /* every later forward pass */
} mk_generate_stats;

/* Receives each generated token and the logits [vocab] it was sampled from (valid during
 * the call; NULL when the pipeline's ranges are token_only). A status other than MK_OK
 * stops generation and is returned. */
typedef mk_status (*mk_token_callback)(void *user, int32_t token, const float *logits, size_t vocab);

/* Greedy generation through a pipeline, on whatever backend and split it was built with.
 * The prompt continues the pipeline's sequence (so a chat keeps its KV cache from turn to
 * turn). Sampling stops at the first token of the tokenizer's end-of-generation set (not
 * passed to the callback; tok may be NULL for none) or after max_new tokens, whichever
 * comes first. The last token sampled (the end-of-generation one, or the max_new-th) is
 * not fed back: the sequence then holds the prompt and all generated tokens but the last.
 * A prompt longer than the context fails with MK_ERR_CONTEXT_OVERFLOW before any
 * decoding. stats may be NULL. */
MK_API mk_status mk_pipeline_generate(mk_pipeline *pipeline, const mk_tokenizer *tok, const int32_t *prompt,
                                      size_t n_prompt, size_t max_new, mk_token_callback callback, void *user,
                                      mk_generate_stats *stats);

/* ========================================================= placed pipelines == */

/* The multi-device single-node pipeline: a model cut into ranges, each range on its own
 * device (cuda) or core share (cpu), many sequences in flight. Every range has its own
 * worker (a host thread) and its own stream; neighbouring workers are joined by a bounded
 * queue that says which micro-batch (one step of one sequence) comes next and by a seam
 * transport that carries its boundary, so while range i computes a step of sequence m,
 * range i+1 computes a step of another. Each range keeps a KV cache per sequence slot and
 * each slot one preallocated boundary (backend memory) per seam: a step allocates nothing.
 * A sequence leaves on a stop id or its token limit and a queued one takes its slot once
 * every stage's KV pool promises the blocks of its whole run (mk_sequence_reserve; first come,
 * first served). mk_sched_submit refuses with MK_ERR_KV_POOL_FULL a sequence no pool could
 * ever hold. */

typedef struct mk_sched mk_sched;

/* How the boundary crosses each seam between neighbouring workers: mk_sched_options.seam
 * is a transport of the seams API (mk_seam_kind) or 0 for the placement rule:
 *   0      NCCL between workers on distinct cuda devices where this build has NCCL, else
 *          LOCAL (a device-to-device copy; a memcpy on the cpu backend)
 *   LOCAL  device-to-device copy on the workers' streams
 *   WIRE   the TensorBundle packed to protobuf bytes and unpacked (a host-staged run)
 *   UNIX, TCP  a stream connection per seam inside this process (a socketpair or a
 *          loopback TCP connection between the two worker threads): pinned staging,
 *          TensorBundle frames
 *   NCCL   a two-rank communicator per seam (cuda backend, distinct devices)
 * A transport that cannot join two workers (NCCL on the cpu backend or on one device, or in
 * a build without NCCL) fails mk_sched_create with its status. */

/* Called on the tail worker's thread for each generated token, in order per sequence;
 * `logits` [vocab] is valid only during the call. Must not call back into the mk_sched. */
typedef void (*mk_sched_token_fn)(void *user, uint64_t seq_id, size_t index, int32_t token, const float *logits,
                                  size_t vocab);

typedef struct mk_sched_options {
    size_t struct_size;        /* sizeof(mk_sched_options): set by mk_sched_options_default */
    mk_range_options range;    /* backend kind, weight dtype, max_context, max_batch_tokens
                                  (the longest prompt); backend.device comes from devices;
                                  cpu backend.threads is per worker, 0 = the process's cores
                                  divided among the workers (at least 1 each) */
    const int64_t *cuts;       /* last layer of each range but the last (ascending) ... */
    size_t n_cuts;             /* ... or, with split_auto, ignored */
    bool split_auto;           /* balanced cuts for n_workers ranges (mk_split_auto) */
    size_t n_workers;          /* split_auto: ranges (one worker each); 0 = n_devices (or 1) */
    const int *devices;        /* device of each range [n_devices]; NULL = range i on device i */
    size_t n_devices;
    size_t max_sequences;      /* sequences in flight (KV and activation slots); default 8 */
    mk_seam_kind seam;         /* 0 (default): the placement rule above */
    mk_sched_token_fn on_token; /* optional */
    void *user;
    size_t timeline_capacity;  /* step records kept per worker for the timeline (later steps
                                  are not recorded); 0 = none */
    size_t prefill_chunk;      /* prompt rows per step of a sequence: a longer prompt goes
                                  through in chunks of this many (its first token comes with
                                  the last chunk), so it never holds the other sequences'
                                  decode steps for its whole prefill; 0 = the whole prompt in
                                  one step */
} mk_sched_options;

MK_API mk_sched_options mk_sched_options_default(void);

/* Build the ranges on their devices and start one worker thread per range. The model
 * must outlive the mk_sched. Release with mk_sched_free. */
MK_API mk_status mk_sched_create(const mk_model *model, const mk_sched_options *options, mk_sched **out);
/* Stop the workers (sequences still in flight are abandoned) and free every range. */
MK_API void mk_sched_free(mk_sched *sched);

MK_API size_t mk_sched_worker_count(const mk_sched *sched);
/* The number of workers (ranges), and worker i's range (owned by the mk_sched; do not
 * forward through it while running). */
MK_API const mk_range *mk_sched_worker_range(const mk_sched *sched, size_t worker);
/* Worker i's share of the per-step cost the cuts were balanced on (sums to 1). */
MK_API double mk_sched_worker_share(const mk_sched *sched, size_t worker);
/* The transport of seam i (between worker i and i + 1) as built (the placement rule
 * resolved); 0 for an index past the last seam. */
MK_API mk_seam_kind mk_sched_seam_kind(const mk_sched *sched, size_t seam);
/* Bytes seam i's receiving ends took so far (0 past the last seam). */
MK_API size_t mk_sched_seam_bytes(const mk_sched *sched, size_t seam);

/* Queue a sequence: prompt [n_prompt] token ids (copied), at most max_new_tokens
 * generated, stopping early after any id in stop_ids [n_stop] (copied; e.g. the model's
 * end-of-generation ids). *seq_id names it in the calls below. A prompt id outside the
 * model's vocabulary is refused here (MK_ERR_TOKEN_OUT_OF_RANGE naming it). */
MK_API mk_status mk_sched_submit(mk_sched *sched, const int32_t *prompt, size_t n_prompt, size_t max_new_tokens,
                                 const int32_t *stop_ids, size_t n_stop, uint64_t *seq_id);

typedef enum mk_seq_state {
    MK_SEQ_QUEUED = 1,  /* waiting for a slot and its KV blocks */
    MK_SEQ_RUNNING = 2,
    MK_SEQ_DONE = 3,    /* stopped on a stop id or its token limit */
    MK_SEQ_FAILED = 4,  /* status and error say why; tokens so far are kept */
} mk_seq_state;

typedef struct mk_seq_info {
    mk_seq_state state;
    mk_status status;   /* MK_OK unless FAILED */
    size_t n_tokens;    /* generated so far */
    bool stopped;       /* DONE on a stop id (false: on the token limit) */
    const char *error;  /* when FAILED: the worker, its layers and the cause; valid until
                           mk_sched_free ("" otherwise) */
} mk_seq_info;

/* A sequence's state and up to `cap` of its generated tokens (tokens may be NULL). */
MK_API mk_status mk_sched_poll(mk_sched *sched, uint64_t seq_id, mk_seq_info *info, int32_t *tokens, size_t cap);
/* Block until the sequence is DONE or FAILED (the workers always finish one). */
MK_API mk_status mk_sched_wait(mk_sched *sched, uint64_t seq_id);
/* Block until every submitted sequence is DONE or FAILED. */
MK_API mk_status mk_sched_wait_all(mk_sched *sched);
/* Stop a sequence early (its client went away): a queued one leaves the queue at once; a
 * running one retires after the step in flight, so its slot and KV cache are free within
 * one step. It ends DONE (stopped false) with the tokens generated so far. A sequence
 * already finished is left as it is. */
MK_API mk_status mk_sched_cancel(mk_sched *sched, uint64_t seq_id);
/* Forget a sequence: its record (prompt, tokens, error) is freed as soon as it is DONE or
 * FAILED (at once when it already is); later calls naming it fail. A long-running caller
 * (meshkern serve) releases every sequence it has read, so memory does not grow with the
 * number of sequences served (the id table keeps one pointer per id). */
MK_API mk_status mk_sched_release(mk_sched *sched, uint64_t seq_id);

typedef struct mk_worker_stats {
    size_t steps;          /* forwards run */
    uint64_t busy_ns;      /* time inside them */
    uint64_t cpu_ns;       /* CPU time the worker's thread spent inside them (less than
                              busy_ns when other processes share the cores) */
    uint64_t first_ns;     /* start of the first, end of the last (CLOCK_MONOTONIC) */
    uint64_t last_ns;
} mk_worker_stats;
MK_API mk_status mk_sched_worker_stats(const mk_sched *sched, size_t worker, mk_worker_stats *out);
/* Clear the statistics and the timeline; call while no sequence is in flight. */
MK_API mk_status mk_sched_reset_stats(mk_sched *sched);
/* The worker timeline as JSON: {"workers":N,"steps":[{"worker":i,"seq":id,"rows":r,
 * "start_us":t0,"end_us":t1},...]} with times from the earliest start. *out is malloc'd
 * (mk_buffer_free). */
MK_API mk_status mk_sched_timeline_json(const mk_sched *sched, char **out, size_t *out_len);

/* Balanced cuts: per-layer cost is the weight elements a decode step reads; the head
 * adds one embedding row per token, the tail the final norm and the lm_head. Picks the
 * n_ranges - 1 cuts (last layer of each range but the last) that minimise the largest
 * range cost; shares [n_ranges] (may be NULL) receive each range's fraction. */
MK_API mk_status mk_split_auto(const mk_model *model, size_t n_ranges, int64_t *cuts, double *shares);


/* ============================================================ stage processes == */

/* One process per range (meshkern stage): rank r of `world` owns range r of the cuts.
 * Ranks meet at a rendezvous address (rank 0 listens, the others connect), exchange rank,
 * world and the stage digest (model identity, weight and KV modes, cuts, seam) and refuse any mismatch
 * before the first request; then rank r sends its boundaries to rank r+1 over a stream
 * seam and the last rank sends each sampled token back to rank 0 as a TailResult over
 * its rendezvous connection. Rank 0 takes the requests and keeps up to max_sequences in
 * flight; every rank keeps one sequence (KV cache) per live request, routed by the request
 * id the boundary carries. Every cross-process wait has the deadline timeout_ms; a peer
 * that dies, falls silent or sends a boundary the contract refuses stops the run: every
 * request in flight is reported failed with the status (MK_ERR_PEER_LOST,
 * MK_ERR_PEER_TIMEOUT, the contract's error) and a message naming the rank and the step.
 * The environment variable MESHKERN_FAULT ("rank=R,step=K,kind=exit|silent|corrupt_header|
 * other_digest|other_layer") makes rank R misbehave at its K-th boundary (0-based): tests only. */
typedef struct mk_stage mk_stage;
/* The unique ids of one rank's NCCL communicators with its neighbours, as a launcher handed
 * them out (mk_stage_mpi_setup). Opaque; release with mk_stage_nccl_ids_free. */
typedef struct mk_stage_nccl_ids mk_stage_nccl_ids;
MK_API void mk_stage_nccl_ids_free(mk_stage_nccl_ids *ids);

/* Versioned by struct_size like mk_backend_config (see there). */
typedef struct mk_stage_options {
    size_t struct_size;        /* sizeof(mk_stage_options), set by mk_stage_options_default */
    mk_range_options range;    /* backend and weight mode (every rank alike); max_context and
                                  max_batch_tokens: rank 0's hold for all (sent at startup) */
    const int64_t *cuts;       /* last layer of each range but the last: world - 1 of them ... */
    size_t n_cuts;
    bool split_auto;           /* ... or balanced cuts (mk_split_auto) for `world` ranges */
    int rank, world;           /* 0 <= rank < world, world >= 2 */
    const char *rendezvous;    /* "HOST:PORT" */
    mk_seam_kind seam;         /* MK_SEAM_TCP (default) or MK_SEAM_UNIX (one host) */
    int timeout_ms;            /* deadline of every cross-process wait; 0 = 30000 */
    size_t max_sequences;      /* rank 0: requests in flight; default 8 */
    size_t max_new_tokens;     /* rank 0: tokens per request; default 16 */
    const int32_t *stop_ids;   /* rank 0: a request stops after any of these (copied) */
    size_t n_stop;
    /* nccl seams: the unique ids of this rank's communicators with the previous and the next
       rank, when the launcher handed them out (mk_stage_mpi_setup: rank 0 makes them and
       MPI_Bcast's them, as nccl-tests do); read during mk_stage_join only. NULL: rank 0
       hands them out at the rendezvous */
    const mk_stage_nccl_ids *nccl_ids;
    /* Where the runtime's notices go, one line each without a newline (rank 0: a rank
       joined, a connection dropped at the rendezvous with its peer address and why); NULL:
       nowhere (a failure's message still names what was dropped). Called on the joining
       thread. */
    void (*log)(void *user, const char *line);
    void *log_user;
    /* TLS 1.3 on every connection between the ranks: the rendezvous and control connections
       (rank 0 the server) and the unix/tcp seams, with a pre-shared key or certificates
       (mk_seam_tls; not with the nccl seam). A connection without the key or a trusted
       certificate is dropped at the rendezvous like any stranger. Without it, listeners bind
       loopback unless the rendezvous address says otherwise, and log a notice then. */
    mk_seam_tls tls;
    size_t prefill_chunk;      /* rank 0: prompt rows per step of a request, as
                                  mk_sched_options.prefill_chunk (its first token comes with
                                  the last chunk); 0 = the whole prompt in one step */
} mk_stage_options;
MK_API mk_stage_options mk_stage_options_default(void);

/* Meet the other ranks, compare digests, build this rank's range and connect the seams,
 * all within the deadline. A mismatch (another model file, weight or KV mode, cuts, seam or world)
 * fails every rank with MK_ERR_RECIPE_DIGEST naming the rank. The model must outlive the
 * stage; release with mk_stage_free. */
MK_API mk_status mk_stage_join(const mk_model *model, const mk_stage_options *options, mk_stage **out);
MK_API void mk_stage_free(mk_stage *stage);
MK_API int mk_stage_rank(const mk_stage *stage);
MK_API const mk_range *mk_stage_range(const mk_stage *stage);

typedef struct mk_stage_request {
    const int32_t *prompt;     /* [n_prompt] token ids */
    size_t n_prompt;
} mk_stage_request;

/* The outcome of one request, reported once: on rank 0 for every request (done or failed),
 * on the other ranks for each request they held when the run failed. Pointers are valid
 * during the call only. */
typedef struct mk_stage_report {
    size_t request;            /* index into rank 0's requests */
    mk_status status;          /* MK_OK: done */
    const char *error;         /* why it failed ("" when done) */
    const int32_t *tokens;     /* generated tokens (rank 0), [n_tokens] */
    size_t n_tokens;
    bool stopped;              /* done on a stop id (false: on the token limit) */
} mk_stage_report;
typedef void (*mk_stage_report_fn)(void *user, const mk_stage_report *report);

/* Run until every request is done (rank 0 tells the others) or the run fails. Rank 0
 * passes the requests (requests[i].prompt at most options->range.max_batch_tokens long);
 * the other ranks pass none. Returns MK_OK, or the first failure (every request in flight
 * then reported failed). */
MK_API mk_status mk_stage_serve(mk_stage *stage, const mk_stage_request *requests, size_t n_requests,
                                mk_stage_report_fn report, void *user);

/* A live source of requests for rank 0 (meshkern stage --serve): requests join while the run
 * lasts, each token goes out as it arrives, a request can be cut short, and the run ends when
 * the source closes and the requests in flight are done. Every callback runs on the thread
 * in mk_stage_serve_source, between steps. */
typedef struct mk_stage_arrival {
    const int32_t *prompt;     /* [n_prompt] token ids: valid until the request's report */
    size_t n_prompt;
    size_t max_new_tokens;     /* 0: the stage's max_new_tokens */
    uint64_t tag;              /* the caller's name for it: report->request, on_token's tag */
} mk_stage_arrival;
typedef struct mk_stage_source {
    size_t struct_size;        /* sizeof(mk_stage_source) */
    /* While fewer than max_sequences requests are in flight: true with *next filled to
       admit one, false when there is none now. A request the stage cannot take (no prompt,
       a prompt longer than max_batch_tokens or the context) is reported failed at once
       (MK_ERR_EMPTY_INPUT, MK_ERR_CONTEXT_OVERFLOW), and the run goes on. */
    bool (*take)(void *user, mk_stage_arrival *next);
    /* Each generated token as it arrives (optional): false ends the request now; its
       report is then MK_OK with stopped false, and its KV is free before the next step. */
    bool (*on_token)(void *user, uint64_t tag, int32_t token);
    /* Once per admitted request: done or failed (report->request is its tag). */
    mk_stage_report_fn report;
    /* True: no more requests (a drain); the run ends when those in flight are done. */
    bool (*closed)(void *user);
    /* A descriptor that becomes readable when take or closed may have news (an eventfd or a
       pipe the caller writes and drains in take): rank 0 waits on it beside the ranks'
       connections. -1: rank 0 asks every 20 ms while idle. */
    int wake_fd;
    void *user;
    /* Between steps, for each request in flight that has no step running (optional): true
       ends it now, whether it waits for blocks, is part-way through a chunked prompt or is
       decoding (a client gone: no more of its prompt or tokens are computed). Its report
       is then MK_OK with stopped false and the tokens it had; its KV is free on every
       rank before the next step. */
    bool (*cancelled)(void *user, uint64_t tag);
} mk_stage_source;
/* Rank 0 only, over a tcp or unix seam (an nccl receive cannot wait while idle): serve
 * requests from the source until it closes and the requests in flight are done, or the run
 * fails (every request in flight then reported failed). The other ranks call mk_stage_serve
 * as for a fixed list; while rank 0 is idle it beats, so they wait without a deadline. */
MK_API mk_status mk_stage_serve_source(mk_stage *stage, const mk_stage_source *source);
/* Live figures of rank 0 (any thread, any time): boundaries it sent, forwards it ran (one
 * per step: a step carries every request ready for it), seconds inside them, bytes handed
 * to its seam. */
typedef struct mk_stage_live_stats {
    uint64_t steps;
    double busy_seconds;
    uint64_t bytes_sent;
    uint64_t forwards;
    uint64_t messages_sent; /* seam messages those steps' boundaries went out in (a batch is one) */
} mk_stage_live_stats;
MK_API mk_status mk_stage_live(const mk_stage *stage, mk_stage_live_stats *out);

/* The figures of one seam of a finished run: seam k joins rank k to rank k + 1. */
typedef struct mk_stage_hop {
    size_t boundaries;         /* boundaries that crossed it (rank k's sends, rank k + 1's receipts) */
    size_t bytes;              /* bytes the receiving end took (its mk_seam_bytes) */
    double seam_seconds;       /* time inside the seam's calls: rank k's sends and rank k + 1's
                                  receives (mk_seam_seconds of both ends; an nccl receive
                                  waits for the data, so it includes the sender's compute) */
    double latency_s;          /* mean time from rank k's send of a boundary to rank k + 1's
                                  receipt, by the wall clocks of both (exact on one node, off by
                                  the clocks' skew across nodes; with more than one request in
                                  flight it includes the time the boundary waits while the
                                  receiver is busy: one request in flight measures the hop) */
} mk_stage_hop;
/* Rank 0, after mk_stage_serve returned MK_OK: the figures of seam k (0 <= k < world - 1),
 * which every other rank sends with its goodbye. MK_ERR_INVALID_ARGUMENT on another rank, for
 * another seam or before a finished run; MK_ERR_PEER_LOST when a rank sent none. */
MK_API mk_status mk_stage_hop_stats(const mk_stage *stage, size_t seam, mk_stage_hop *out);

/* Launch by MPI (mpirun, srun): true when an MPI launcher started this process
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment). */
MK_API bool mk_stage_mpi_launched(void);
/* Under MPI, before mk_stage_join: MPI_Init (errors returned, not fatal), rank and world
 * from MPI_Comm_rank/size into options; the stage digests compared with MPI_Allgather (a
 * mismatch fails every rank with MK_ERR_RECIPE_DIGEST naming the rank, before any
 * connection); rank 0 picks a free port on its node's address and MPI_Bcast's the
 * rendezvous "HOST:PORT" into rendezvous[cap] (options->rendezvous points there); with
 * options->seam MK_SEAM_NCCL rank 0 also makes the unique id of every seam's communicator
 * and MPI_Bcast's them: *nccl_ids receives this rank's two (options->nccl_ids points there;
 * release them with mk_stage_nccl_ids_free after mk_stage_join), NULL for another seam.
 * Builds without MPI refuse with MK_ERR_UNSUPPORTED. */
MK_API mk_status mk_stage_mpi_setup(const mk_model *model, mk_stage_options *options, char *rendezvous, size_t cap,
                                    mk_stage_nccl_ids **nccl_ids);
/* MPI_Finalize after a run every rank finished (a failed run exits without it: the
 * launcher ends the rest). */
MK_API void mk_stage_mpi_finalize(void);

#ifdef __cplusplus
}
#endif
#endif /* MESHKERN_H */
