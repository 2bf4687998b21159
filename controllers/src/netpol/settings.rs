//! Flags of the NetworkPolicy controller and their fail-closed validation.
