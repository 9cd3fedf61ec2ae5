"""A persistent recurrent layer: each direction's whole sequence in one CUDA kernel, weights kept on chip.

plan.py decides whether a layer fits and how its units are split over thread
blocks; layer.py wires the kernel into JAX and picks it or the scan (scan.py);
the tests hold both to a numpy mirror of the split and its grid barrier
(tests/jaxring/rnn/host_mirror.py; docs/PERSISTENT_RNN.md).
"""
