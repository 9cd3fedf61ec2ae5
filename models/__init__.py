"""Model definitions trained with jaxring."""
