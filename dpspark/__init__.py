"""dpspark: differentially private k-means and k-median clustering on Spark and Delta Lake."""

__version__ = "0.1.0"
