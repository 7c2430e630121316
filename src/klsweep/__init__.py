"""klsweep: sweep verl's KL settings with Ray Tune and Optuna, stopping unhealthy runs early."""

__version__ = "0.1.0"
