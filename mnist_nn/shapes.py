"""The images' and labels' shapes, shared by the search (which sizes nets) and the model (which
builds them) without either importing the other."""

IMAGE_SIZE = 28
N_CLASSES = 10
