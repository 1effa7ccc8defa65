"""rollart weight transport "mooncake": each version published once into a Mooncake store,
pulled by every engine worker in the background into registered buffers
(``style = "pull"``)."""

__version__ = "0.1.0"
