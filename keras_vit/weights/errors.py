"""The errors of the weights package."""


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model, or a file that is not a valid checkpoint."""


class DownloadError(OSError):
    """A checkpoint could not be fetched; the message says where to put it by hand."""
