"""The experiment runner behind ``python -m grab_exp`` (Hydra-composed training)."""
