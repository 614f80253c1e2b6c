"""A small CNN classifying scikit-learn's bundled 8x8 digits."""
