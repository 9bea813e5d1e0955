"""rlhfctl: RLHF training from YAML recipes on a single controller whose data flow you can see."""

__version__ = "0.1.0"
