/* The program's one option parser (cli_options.h): tables in, values out, the help from
 * the same tables, and one form for every usage error. */
#include "cli_options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"

/* ================================================================ messages == */

static int mk_cli_vusage(const char *command, const char *fmt, va_list ap) {
    fprintf(stderr, "meshkern%s%s: ", command ? " " : "", command ? command : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "; see 'meshkern%s%s --help'\n", command ? " " : "", command ? command : "");
    return 2;
}

int mk_cli_usage_error(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = mk_cli_vusage(command, fmt, ap);
    va_end(ap);
    return rc;
}

int mk_cli_usage_status(const char *command, mk_status s) {
    return mk_cli_usage_error(command, "%s: %s", mk_status_name(s), mk_last_error());
}

/* ==================================================================== help == */

static size_t mk_cli_label(const mk_cli_option *o, char *buf, size_t cap) {
    const int n = snprintf(buf, cap, "%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
    return n < 0 ? 0 : (size_t)n;
}

void mk_cli_help(FILE *f, const mk_cli_command *cmd) {
    fprintf(f, "usage: meshkern %s %s\n", cmd->name, cmd->synopsis);
    if (cmd->about) fputs(cmd->about, f);
    size_t width = 0;
    char label[128];
    for (size_t g = 0; g < cmd->n_groups; g++)
        for (size_t i = 0; i < cmd->groups[g].n; i++) {
            const size_t n = mk_cli_label(&cmd->groups[g].opt[i], label, sizeof label);
            width = n > width ? n : width;
        }
    for (size_t g = 0; g < cmd->n_groups; g++) {
        if (!cmd->groups[g].n) continue;
        fprintf(f, "%s:\n", cmd->groups[g].title);
        for (size_t i = 0; i < cmd->groups[g].n; i++) {
            const mk_cli_option *o = &cmd->groups[g].opt[i];
            mk_cli_label(o, label, sizeof label);
            fprintf(f, "  %-*s  %s", (int)width, label, o->help);
            if (o->dflt) fprintf(f, " (default %s)", o->dflt);
            if (o->alias) fprintf(f, " [also %s]", o->alias);
            fprintf(f, "\n");
        }
    }
}

/* ================================================================== values == */

/* Decimal digits only: strtoull would turn "-1" into SIZE_MAX and skip leading blanks. */
static bool mk_cli_count(const char *v, size_t lo, size_t hi, size_t *out) {
    char *end = NULL;
    errno = 0;
    const unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno || !(x >= lo && x <= hi)) return false;
    *out = (size_t)x;
    return true;
}

bool mk_cli_parse_list(const char *value, void *dest, char *why, size_t why_len) {
    mk_cli_list *l = dest;
    l->n = 0;
    l->is_auto = false;
    if (l->auto_ok && strcmp(value, "auto") == 0) {
        l->is_auto = true;
        return true;
    }
    for (const char *p = value;;) {
        char *end = NULL;
        errno = 0;
        const long long x = (*p == '-' || (*p >= '0' && *p <= '9')) ? strtoll(p, &end, 10) : 0;
        if (!end || end == p || (*end && *end != ',')) {
            snprintf(why, why_len, "expected comma-separated %ss%s", l->item, l->auto_ok ? " or auto" : "");
            return false;
        }
        if (errno || x < l->lo || x > l->hi || (*p == '-' && l->lo >= 0)) { /* -0 too, where no sign belongs */
            snprintf(why, why_len, "%s %.*s is out of range (%lld to %lld)", l->item, (int)(end - p), p,
                     (long long)l->lo, (long long)l->hi);
            return false;
        }
        if (l->n == l->cap) {
            snprintf(why, why_len, "more than %zu %ss", l->cap, l->item);
            return false;
        }
        l->v[l->n++] = x;
        if (!*end) return true;
        p = end + 1;
    }
}

/* ================================================================= parsing == */

static bool mk_cli_is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

static const mk_cli_option *mk_cli_find(const mk_cli_command *cmd, const char *a) {
    for (size_t g = 0; g < cmd->n_groups; g++)
        for (size_t i = 0; i < cmd->groups[g].n; i++) {
            const mk_cli_option *o = &cmd->groups[g].opt[i];
            if (strcmp(a, o->name) == 0 || (o->alias && strcmp(a, o->alias) == 0)) return o;
        }
    return NULL;
}

/* One option's value (a = the spelling given). */
static int mk_cli_take(const mk_cli_command *cmd, const mk_cli_option *o, const char *a, const char *v) {
    char why[256] = "";
    switch (o->kind) {
    case MK_CLI_FLAG:
        *(bool *)o->dest = true;
        return -1;
    case MK_CLI_TEXT:
        *(const char **)o->dest = v;
        return -1;
    case MK_CLI_COUNT:
        if (mk_cli_count(v, o->lo, o->hi, o->dest)) return -1;
        return mk_cli_usage_error(cmd->name, "%s %s: expected a count from %zu to %zu (the limit)", a, v, o->lo, o->hi);
    case MK_CLI_CALL:
        if (o->parse(v, o->dest, why, sizeof why)) return -1;
        mk_clear_error(); /* a library parser's message is in `why` */
        return mk_cli_usage_error(cmd->name, "%s %s: %s", a, v, why);
    }
    return mk_cli_usage_error(cmd->name, "%s: an option of no known kind", a);
}

int mk_cli_parse(const mk_cli_command *cmd, int argc, char **argv, const char **positional) {
    size_t n_pos = 0;
    while (n_pos < MK_CLI_MAX_POSITIONAL && cmd->positional[n_pos]) n_pos++;
    /* --help wherever an option may stand (not as an option's value, not as TEXT) */
    for (int i = 0; i < argc; i++) {
        if ((size_t)i < n_pos && strcmp(cmd->positional[i], "TEXT") == 0) continue; /* tokenize M -h: text */
        const mk_cli_option *o = (size_t)i >= n_pos ? mk_cli_find(cmd, argv[i]) : NULL;
        if (o && o->meta) i++;
        else if (mk_cli_is_help(argv[i])) {
            mk_cli_help(stdout, cmd);
            return 0;
        }
    }
    for (size_t k = 0; k < n_pos; k++) {
        const char *name = cmd->positional[k];
        /* MODEL is a file or --random[:...]; any other dash word is an option misplaced */
        if ((size_t)argc <= k || (strcmp(name, "MODEL") == 0 && argv[k][0] == '-' && strncmp(argv[k], "--random", 8) != 0))
            return mk_cli_usage_error(cmd->name, "missing %s (it comes first, before the options)", name);
        positional[k] = argv[k];
    }
    for (int i = (int)n_pos; i < argc; i++) {
        const char *a = argv[i];
        const mk_cli_option *o = mk_cli_find(cmd, a);
        if (!o && a[0] == '-') return mk_cli_usage_error(cmd->name, "unknown option '%s'", a);
        if (!o) return mk_cli_usage_error(cmd->name, "unexpected argument '%s'", a);
        const char *v = NULL;
        if (o->meta) {
            if (i + 1 >= argc) return mk_cli_usage_error(cmd->name, "%s needs a value (%s)", a, o->meta);
            v = argv[++i];
        }
        const int rc = mk_cli_take(cmd, o, a, v);
        if (rc >= 0) return rc;
    }
    return -1;
}

/* The spelling of the first option of `group` that argv gives (argv as mk_cli_parse took it:
 * the positionals first, every option's value after it), or NULL. */
static const char *mk_cli_given_in(const mk_cli_command *cmd, int argc, char **argv, const mk_cli_group *group) {
    size_t i = 0;
    while (i < MK_CLI_MAX_POSITIONAL && cmd->positional[i]) i++;
    for (; (int)i < argc; i++) {
        const mk_cli_option *o = mk_cli_find(cmd, argv[i]);
        if (!o) continue;
        if (o >= group->opt && o < group->opt + group->n) return argv[i];
        if (o->meta) i++;
    }
    return NULL;
}

const char *mk_cli_given(const mk_cli_command *cmd, int argc, char **argv, const char *name) {
    for (size_t g = 0; g < cmd->n_groups; g++)
        for (size_t k = 0; k < cmd->groups[g].n; k++)
            if (strcmp(cmd->groups[g].opt[k].name, name) == 0) {
                const mk_cli_group one = {NULL, &cmd->groups[g].opt[k], 1};
                return mk_cli_given_in(cmd, argc, argv, &one);
            }
    return NULL;
}

int mk_cli_needs(const mk_cli_command *cmd, int argc, char **argv, const mk_cli_group *group, size_t skip, bool ok,
                 const char *needed) {
    if (ok) return -1;
    const mk_cli_group rest = {NULL, group->opt + skip, group->n > skip ? group->n - skip : 0};
    const char *a = mk_cli_given_in(cmd, argc, argv, &rest);
    return a ? mk_cli_usage_error(cmd->name, "%s has no effect without %s", a, needed) : -1;
}

/* ============================================ options shared by commands == */

mk_cli_option mk_cli_opt_max_tokens(size_t *n, size_t hi, const char *dflt) {
    return (mk_cli_option){"--max-tokens", "--n", "N", "tokens to generate at most", dflt, MK_CLI_COUNT, n, 1, hi, NULL};
}

mk_cli_option mk_cli_opt_max_sequences(size_t *n, const char *dflt) {
    return (mk_cli_option){"--max-sequences", "--batch", "N", "sequences in flight at once (the others wait for a slot)",
                           dflt, MK_CLI_COUNT, n, 1, MK_CLI_MAX_SEQUENCES, NULL};
}

mk_cli_option mk_cli_opt_prefill_chunk(size_t *n, const char *dflt) {
    return (mk_cli_option){"--prefill-chunk", NULL, "N",
                           "prompt tokens per step of a sequence: a longer prompt goes in chunks between the others' "
                           "decode steps (0: whole)",
                           dflt, MK_CLI_COUNT, n, 0, 1u << 20, NULL};
}

mk_cli_option mk_cli_opt_step_sequences(size_t *n) {
    return (mk_cli_option){"--step-sequences", NULL, "N",
                           "sequences one forward may carry (continuous batching; 1: one sequence per step)",
                           "--max-sequences, at most 64", MK_CLI_COUNT, n, 1, MK_MAX_BATCH_SEQUENCES, NULL};
}

size_t mk_cli_step_sequences(size_t given, size_t max_sequences) {
    const size_t n = given ? given : max_sequences;
    return n < MK_MAX_BATCH_SEQUENCES ? n : MK_MAX_BATCH_SEQUENCES;
}

mk_cli_option mk_cli_opt_split(mk_cli_list *cuts) {
    return (mk_cli_option){"--split", NULL, cuts->auto_ok ? "auto|L1,L2,..." : "L1,L2,...",
                           cuts->auto_ok ? "the last layer of each range but the last, or auto (balanced cuts)"
                                         : "the last layer of each range but the last",
                           NULL, MK_CLI_CALL, cuts, 0, 0, mk_cli_parse_list};
}

mk_cli_option mk_cli_opt_devices(mk_cli_list *devices) {
    return (mk_cli_option){"--devices", NULL, "D0,D1,...", "one cuda device per range", NULL, MK_CLI_CALL, devices,
                           0, 0, mk_cli_parse_list};
}

mk_cli_option mk_cli_opt_stop(mk_cli_list *stop) {
    return (mk_cli_option){"--stop", NULL, "IDS", "token ids that end a sequence (beside the model's end of generation)",
                           NULL, MK_CLI_CALL, stop, 0, 0, mk_cli_parse_list};
}

mk_cli_option mk_cli_opt_prompts(const char **path, const char *what) {
    return (mk_cli_option){"--prompts", NULL, "FILE", what, NULL, MK_CLI_TEXT, (void *)path, 0, 0, NULL};
}

static bool mk_cli_parse_seam(const char *v, void *dest, char *why, size_t why_len) {
    const mk_status s = mk_seam_kind_from_name(v, dest);
    if (s != MK_OK) snprintf(why, why_len, "%s", mk_last_error());
    return s == MK_OK;
}

static bool mk_cli_parse_seam_or_auto(const char *v, void *dest, char *why, size_t why_len) {
    if (strcmp(v, "auto") != 0) return mk_cli_parse_seam(v, dest, why, why_len);
    *(mk_seam_kind *)dest = 0; /* the placement rule */
    return true;
}

mk_cli_option mk_cli_opt_seam(mk_seam_kind *kind, bool auto_ok, const char *dflt) {
    return (mk_cli_option){"--seam", NULL, auto_ok ? "auto|local|wire|unix|tcp|nccl" : "local|wire|unix|tcp|nccl",
                           "the transport of every seam", dflt, MK_CLI_CALL, kind, 0, 0,
                           auto_ok ? mk_cli_parse_seam_or_auto : mk_cli_parse_seam};
}
