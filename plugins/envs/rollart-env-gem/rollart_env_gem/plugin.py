"""Registers ``gem/<id>`` for every GEM env that runs offline (from the shipped manifest).

Registration reads ``data/manifest.json`` only; GEM and reasoning-gym are imported when a
config selects one of the names. GEM ids that cannot run here (they download NLTK data
or Hugging Face datasets, or fail in gem-llm 0.1.0 itself) are reported as unavailable
with the reason, so ``rollart plugins`` says why they are missing.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from rollart_env_gem.factory import PREFIX, GemFactory, load_manifest
from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    manifest = load_manifest()
    try:
        installed = version("gem-llm")
    except PackageNotFoundError:
        installed = None
    if installed != manifest["gem_llm"]:
        # The manifest was probed on one release; another may run a different set.
        raise RuntimeError(
            f"rollart-env-gem's manifest was made with gem-llm {manifest['gem_llm']}, but "
            f"{installed or 'no gem-llm'} is installed: pip install gem-llm=={manifest['gem_llm']}, "
            "or regenerate it with python -m rollart_env_gem.probe --write"
        )
    for gem_id, facts in manifest["registered"].items():
        registry.register(
            PREFIX + gem_id,
            factory=GemFactory(gem_id),
            options="rollart_env_gem.env:GemOptions",
            summary=facts["summary"],
            traits={"turns": facts["turns"], "character": facts["character"]},
        )
    unavailable = getattr(registry, "unavailable", None)
    if unavailable is not None:
        for gem_id, reason in manifest["excluded"].items():
            unavailable(PREFIX + gem_id, reason)
