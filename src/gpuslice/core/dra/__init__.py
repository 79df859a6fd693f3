"""DRA (Dynamic Resource Allocation): the pure data and rules of gpuslice's DRA driver."""
