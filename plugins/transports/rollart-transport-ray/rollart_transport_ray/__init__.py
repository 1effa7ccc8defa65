"""rollart weight transport "ray": buckets published once into Ray's object store, pulled
by every engine worker on demand (``style = "pull"``)."""

__version__ = "0.1.0"
