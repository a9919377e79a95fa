"""What `astraflow run` does before the broker starts needs no torch.

The launcher process validates the config, checks the model and data, finds the cached
tiny model and names the job's topics before it starts anything; importing torch for that
(~1.4 s warm, several seconds cold) delayed every run and kept ~300 MB in a process that
only supervises. The loss names config validation needs live apart from the loss math.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from astraflow.topics import job_topics
from astraflow.actors.common import model_path
from astraflow.checks import check_data, check_model
from astraflow.config import load_config
import astraflow.launcher

cfg = load_config(sys.argv[1])
for policy in cfg.policy_names:
    check_model(cfg.view(policy))
    print(model_path(cfg.view(policy)))
check_data(cfg)
job_topics(cfg).specs()
print("torch loaded:", "torch" in sys.modules)
"""


def test_the_launcher_path_before_the_broker_imports_no_torch(tmp_path):
    from astraflow.models.bootstrap import ensure_tiny_model

    ensure_tiny_model()  # built (torch) here if missing: the launcher only looks it up
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "arithmetic_grpo.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch loaded: False" in proc.stdout, proc.stdout


def test_the_loss_names_config_accepts_are_the_losses_the_trainer_has():
    from astraflow.engines.loss_names import LOSS_PARAMS, RETIRED_LOSSES
    from astraflow.engines.losses import POLICY_LOSSES

    assert set(LOSS_PARAMS) == set(POLICY_LOSSES)
    assert not set(RETIRED_LOSSES) & set(POLICY_LOSSES)
