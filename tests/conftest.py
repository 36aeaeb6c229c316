import dflash_core  # noqa: F401  (system BLAS before MLX)
import pytest

from dflash_core.loading import load_pair
from dflash_core.random_models import FAMILIES, write_pair

PROMPTS = [
    "def fib(n):",
    "import os\nfor name in os.listdir('.'):\n",
    "class Stack:\n    def push(self, item):",
    "x = [i * i for i in range(10)]\nprint(",
]


@pytest.fixture(scope="session")
def random_dirs(tmp_path_factory):
    """family -> (target dir, draft dir): small random models the tests build themselves."""
    root = tmp_path_factory.mktemp("random-models")
    return {fam: write_pair(root, fam, seed=11 + i) for i, fam in enumerate(FAMILIES)}


@pytest.fixture(scope="session")
def random_pairs(random_dirs):
    return {fam: load_pair(str(t), str(d)) for fam, (t, d) in random_dirs.items()}
