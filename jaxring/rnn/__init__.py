"""A persistent recurrent layer: each direction's whole sequence in one kernel, weights kept on chip.

plan.py decides whether a layer fits and how its units are split over thread
blocks; host_mirror.py runs that split and its grid barrier on the host, step
for step as the kernel would; layer.py wires it into JAX (docs/PERSISTENT_RNN.md).
"""
