"""meshkern: run contiguous layer ranges of Llama models and exchange the residual stream
as protobuf TensorBundles, from Python (cffi over libmeshkern's public C API).

    import meshkern
    model = meshkern.Model.open("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = model.tokenizer()
    pipe = model.pipeline(cuts=[14])                       # two ranges: 0..14 | 15..29
    print("".join(pipe.generate_text(tok, "What is the capital of France?", 24)))

Low-level access to every function of ``meshkern.h``: ``meshkern.ffi`` and ``meshkern.lib``.
"""

from ._lib import LIBRARY_PATH, ffi, lib
from .errors import (ArchitectureError, BoundaryContractError, DeviceError, GeneralError, MeshkernError,
                     ModelFileError, SeamError, TextError, WireError)
from .core import (Boundary, BoundaryHeader, Bundle, Detokenizer, GenerateStats, Model, Pipeline, Range, Role, Scheduler,
                   Seam, SeamListener, SeqInfo, Sequence, Stage, TailOutput, Tokenizer, seed_hparams,
                   tail_result_pack_logits, tail_result_pack_token, tail_result_validate)
from .shard import Shard
from . import errors

__version__ = "0.4.0"
