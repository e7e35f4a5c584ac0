"""What a decision model is made of and how it answers: backbone, features, heads, trees, routing, saving."""
