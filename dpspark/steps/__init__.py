"""Steps the families share, below the families (DESIGN.md, "Layout"): the DP Lloyd step
(``lloyd``: the noisy update, its threshold and move; its Spark pass ``lloyd_pass`` and executor
kernel ``lloyd_kernels``) and the private LSH tree (``tree``, executor kernel ``tree_kernels``).
The families import them from here, never from each other."""
