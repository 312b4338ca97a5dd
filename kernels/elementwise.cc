// placeholder: filled in by the CUDA-backend work
