"""The data path: image datasets on disk, JPEG decoding on emugpu as nvJPEG
does it, and training fed by a DataLoader that says where each epoch's time
went."""
