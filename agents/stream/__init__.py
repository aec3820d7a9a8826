"""Reading the input topics, applying them on the writer thread, and publishing what they caused."""
