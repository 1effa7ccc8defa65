"""Conformance kits and pytest helpers for plugin authors.

- ``check_env(env)`` / ``check_reward(backend)``: environments and reward backends;
- ``check_engine`` / ``check_trainer`` / ``check_transport``: engines, trainers, transports;
- the pytest plugin (auto-loaded): fixtures ``rollart_plugins`` (an isolated plugin set,
  entry points not loaded) and ``register_plugin`` (add a plugin for one test).
"""
