"""`gpuslice demo`: pods sharing a simulated node's GPUs, and one pod leaking memory."""
