"""memfit's version (``memfit.__version__``), here at the bottom floor so that what records
it (the run folder's marker) need not import the package's top."""

VERSION = "0.1.0"
