"""Env ``category``: one-turn, open-ended; scored by a judge, not by a rule."""
