"""What a backend's *options* need installed (an options model's ``requires()``, e.g.
trainer torch's ``lora`` needs peft) is checked as a backend's own heavy stack is:
`validate` warns with the install hint, `train` stops before any worker starts. Before, a
LoRA run without peft failed inside the trainer worker 28 s in (SmolLM2 on vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rollart_trainer_torch.options")

from rollart_trainer_torch.options import LoraOptions, TorchTrainerOptions

from rollart_sdk.cli import main

ROOT = Path(__file__).resolve().parents[1]
HINT = "pip install 'no-such-stack[extra]'"  # brackets: said as written, not as markup


def test_lora_needs_peft() -> None:
    assert TorchTrainerOptions().requires() == {}
    assert set(TorchTrainerOptions(lora=LoraOptions()).requires()) == {"peft"}


def test_a_module_the_options_need_is_warned_by_validate_and_stops_train(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(TorchTrainerOptions, "requires",
                        lambda self: {"no_such_stack_xyz": HINT})
    config = str(ROOT / "examples" / "minimal.yaml")
    assert main(["validate", config, f"output_dir={tmp_path}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("trainer 'torch' with these options needs the Python package that provides "
            f"'no_such_stack_xyz', which is not installed in this Python; {HINT}") in out, out
    assert main(["train", config, f"output_dir={tmp_path}", "--no-progress"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "trainer.name (line " in err and HINT in err, err
    assert not any(tmp_path.iterdir())  # nothing started: no run directory
