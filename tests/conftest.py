import os

import pytest
import torch

# One inductor cache for the whole run: the compile tests share kernels.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.getcwd(), ".inductor-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
