"""GEM (gem-llm) environments as rollart envs ``gem/<id>`` (plugin ``rollart-env-gem``)."""

from rollart_env_gem.factory import MANIFEST, GemFactory, load_manifest

__all__ = ["MANIFEST", "GemFactory", "load_manifest"]
