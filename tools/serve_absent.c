/* meshkern serve in a build without libmicrohttpd or libcjson: says so. */
#include <stdio.h>

#include "serve.h"

int mk_cli_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "meshkern serve: unavailable: this build has no HTTP server (it needs libmicrohttpd and libcjson; "
                    "scripts/deps.sh installs them, then reconfigure with MESHKERN_WITH_SERVE=ON)\n");
    return 2;
}
