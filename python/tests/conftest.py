import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = Path(os.environ.get("MESHKERN_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.fixture(scope="session")
def smollm2_path():
    if not SMOLLM2.is_file():
        if os.environ.get("MESHKERN_REQUIRE_MODEL"):
            pytest.fail(f"model {SMOLLM2} is missing (MESHKERN_REQUIRE_MODEL is set)")
        pytest.skip(f"model {SMOLLM2} not downloaded (scripts/fetch_model.sh)")
    return str(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    import meshkern

    return meshkern.Model.open(smollm2_path)
