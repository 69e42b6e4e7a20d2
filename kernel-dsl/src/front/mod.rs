//! The front end: syntax to AST, then IR construction for one specialization.
