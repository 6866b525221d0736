/* One option parser for every command of the program (cli_options.c): each command lists
 * its options in a table (name, an older spelling, the value's name, help, where the
 * value goes); the parser reads argv against it, prints the command's help for --help,
 * and answers every usage error the same way: one line on stderr naming the problem and
 * pointing at `meshkern COMMAND --help`, exit status 2.
 *
 * An option shared by several commands is made by one constructor below, so it has one
 * name, one value syntax, one limit and one help line wherever it appears. */
#ifndef MK_TOOLS_CLI_OPTIONS_H
#define MK_TOOLS_CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meshkern.h"

typedef enum mk_cli_kind {
    MK_CLI_FLAG,  /* no value: *(bool *)dest = true */
    MK_CLI_TEXT,  /* *(const char **)dest = the value */
    MK_CLI_COUNT, /* *(size_t *)dest: decimal digits only, from lo to hi */
    MK_CLI_CALL,  /* parse(value, dest, ...) */
} mk_cli_kind;

/* MK_CLI_CALL: store the value at dest, or say why not (a phrase: "unknown seam 'x'"). */
typedef bool (*mk_cli_parse_fn)(const char *value, void *dest, char *why, size_t why_len);

typedef struct mk_cli_option {
    const char *name;  /* "--max-tokens" */
    const char *alias; /* another spelling taken exactly the same way ("--n"), or NULL */
    const char *meta;  /* the value's name in the help ("N"); NULL: a flag without a value */
    const char *help;  /* one line */
    const char *dflt;  /* the default, shown in the help, or NULL */
    mk_cli_kind kind;
    void *dest;
    size_t lo, hi;         /* MK_CLI_COUNT */
    mk_cli_parse_fn parse; /* MK_CLI_CALL */
} mk_cli_option;

typedef struct mk_cli_group {
    const char *title; /* "options", "backend options", ... */
    const mk_cli_option *opt;
    size_t n;
} mk_cli_group;

#define MK_CLI_MAX_POSITIONAL 2

typedef struct mk_cli_command {
    const char *name;     /* as typed after `meshkern`: "run", "stage", ... */
    const char *synopsis; /* after "meshkern NAME ": "MODEL --tokens IDS [options]" */
    const char *about;    /* printed under the synopsis (lines end in '\n'), or NULL */
    /* Positional arguments, before any option: "MODEL" (a GGUF file or --random[:...]),
     * "TEXT" (any text). */
    const char *positional[MK_CLI_MAX_POSITIONAL];
    const mk_cli_group *groups;
    size_t n_groups;
} mk_cli_command;

/* The options of `cmd` over argv (argv[0] is the first positional; positional[i] gets
 * them). Returns -1 when every argument was taken (go on), 0 after printing the help on
 * stdout (--help or -h anywhere an option may stand), 2 after a usage error. */
int mk_cli_parse(const mk_cli_command *cmd, int argc, char **argv, const char **positional);
/* The help of one command, from its table. */
void mk_cli_help(FILE *f, const mk_cli_command *cmd);
/* A usage error found after parsing: "meshkern COMMAND: MESSAGE; see 'meshkern COMMAND --help'"
 * on stderr; returns 2. */
int mk_cli_usage_error(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A usage error carrying the library's status and message (a bad combination the library
 * checked before anything ran); returns 2. */
int mk_cli_usage_status(const char *command, mk_status s);

/* Options that only matter with another: the spelling argv gave of option `name` (after
 * mk_cli_parse took argv), or NULL when it was not given. */
const char *mk_cli_given(const mk_cli_command *cmd, int argc, char **argv, const char *name);
/* Unless `ok`, any option of group->opt[skip..] that argv gives is a usage error: "X has no
 * effect without NEEDED" (returns 2); -1 when there is nothing to say. An option given
 * that would be silently ignored is refused, so a run is never taken for what was asked. */
int mk_cli_needs(const mk_cli_command *cmd, int argc, char **argv, const mk_cli_group *group, size_t skip, bool ok,
                 const char *needed);

/* A comma-separated list of integers, each from lo to hi, at most cap of them; "auto"
 * too when auto_ok (then is_auto and no values). */
typedef struct mk_cli_list {
    int64_t *v; /* [cap] */
    size_t cap, n;
    int64_t lo, hi;
    const char *item; /* what one value is, for messages ("token id", "layer", "device") */
    bool auto_ok, is_auto;
} mk_cli_list;
bool mk_cli_parse_list(const char *value, void *list, char *why, size_t why_len);

/* ============================================ options shared by commands == */

/* The limits of the counts the command line takes (each refused above its limit with a
 * usage error naming it, before anything is allocated). */
#define MK_CLI_MAX_NEW_TOKENS ((size_t)1 << 20)
#define MK_CLI_MAX_SEQUENCES ((size_t)4096)
#define MK_CLI_MAX_THREADS ((size_t)1024)
#define MK_CLI_MAX_DEVICE 1023
#define MK_CLI_MAX_LIST 64 /* cuts, stop ids */

/* --max-tokens N (older spelling --n): tokens to generate at most. */
mk_cli_option mk_cli_opt_max_tokens(size_t *n, size_t hi, const char *dflt);
/* --max-sequences N (older spelling --batch): sequences in flight at once. */
mk_cli_option mk_cli_opt_max_sequences(size_t *n, const char *dflt);
/* --step-sequences N: sequences one forward may carry (continuous batching; 1: one at a
 * time). Its value for a run of max_sequences in flight: N, or by default all of them up to
 * MK_MAX_BATCH_SEQUENCES. */
mk_cli_option mk_cli_opt_step_sequences(size_t *n);
/* --prefill-chunk N: mk_sched_options.prefill_chunk (0: a prompt in one step). */
mk_cli_option mk_cli_opt_prefill_chunk(size_t *n, const char *dflt);
size_t mk_cli_step_sequences(size_t given, size_t max_sequences);
/* --split L1,L2,...: the last layer of every range but the last (auto_ok: or "auto"). */
mk_cli_option mk_cli_opt_split(mk_cli_list *cuts);
/* --devices D0,D1,...: one cuda device per range. */
mk_cli_option mk_cli_opt_devices(mk_cli_list *devices);
/* --stop IDS: token ids that end a sequence (beside the model's end of generation). */
mk_cli_option mk_cli_opt_stop(mk_cli_list *stop);
/* --prompts FILE: one prompt per line; "-" is standard input. */
mk_cli_option mk_cli_opt_prompts(const char **path, const char *what);
/* --seam KIND: the transport of every seam (auto_ok: "auto" stores 0, the placement rule). */
mk_cli_option mk_cli_opt_seam(mk_seam_kind *kind, bool auto_ok, const char *dflt);

/* A list's storage: `name` holds up to `cap` values. */
#define MK_CLI_LIST(store, lo_, hi_, item_, auto_ok_) \
    ((mk_cli_list){.v = (store), .cap = sizeof(store) / sizeof *(store), .lo = (lo_), .hi = (hi_), .item = (item_), .auto_ok = (auto_ok_)})

#endif
