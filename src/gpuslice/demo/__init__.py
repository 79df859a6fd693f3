"""The `gpuslice demo` scenario (seed 000) on an emulated node."""
