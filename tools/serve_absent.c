/* meshkern serve in a build without libmicrohttpd or libcjson: says so. */
#include <stdio.h>

#include "serve.h"

int mk_cli_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "meshkern serve: unavailable: this build has no HTTP server (it needs libmicrohttpd and libcjson; "
                    "scripts/deps.sh installs them, then reconfigure with MESHKERN_WITH_SERVE=ON)\n");
    return 2;
}

int mk_cli_stage_serve(const char *model_path, const mk_model *model, mk_stage_options *o, const mk_serve_settings *set) {
    (void)model_path, (void)model, (void)o, (void)set;
    fprintf(stderr, "meshkern stage: --serve unavailable: this build has no HTTP server (it needs libmicrohttpd and "
                    "libcjson; scripts/deps.sh installs them, then reconfigure with MESHKERN_WITH_SERVE=ON)\n");
    return 2;
}
