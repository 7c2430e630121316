"""A stand-in for the ``vllm`` package in the CPU run of ``benchmarks/gpu_smoke.sh``: its precondition imports
``vllm``, which needs CUDA and is not installed on CPU machines. Nothing else is imported from it: the stand-in of
``verl.trainer.main_ppo`` (``tests/standins/verl_main_ppo.py``) imitates the rollout itself."""

__version__ = "0.24.0"  # the version verl[vllm]==0.9.1 pins
