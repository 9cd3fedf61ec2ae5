"""Deep Speech 2 (Amodei et al. 2015): model, CTC loss, decoders, speech data."""
