import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.models.loading import load_pair
from dflash_core.training.random_models import FAMILIES, write_pair

pytest_plugins = ["ui_pair"]  # the launched playground fixture, `served`


# where the family's seed by position gives a random target that emits EOS within the 150 tokens the
# accepted-length tests decode (too few cycles for every accepted length), one that does not
SEEDS = {"gpt_oss": 15, "qwen3_next": 20}


@pytest.fixture(scope="session")
def random_dirs(tmp_path_factory):
    """family -> (target dir, draft dir): small random models the tests build themselves."""
    root = tmp_path_factory.mktemp("random-models")
    return {fam: write_pair(root, fam, seed=SEEDS.get(fam, 11 + i)) for i, fam in enumerate(FAMILIES)}


@pytest.fixture(scope="session")
def random_pairs(random_dirs):
    return {fam: load_pair(str(t), str(d)) for fam, (t, d) in random_dirs.items()}
