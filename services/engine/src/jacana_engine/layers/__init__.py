"""Building blocks of the decoder: norms, rotary embedding, MLP, paged attention."""
