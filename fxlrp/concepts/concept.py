r"""Concepts: sets of indices along one dimension of a node's output, their masks and relevance.

A *concept* of a node is a set of indices along one dimension of its output: a channel of a
convolution (``[batch, channels, height, width]``, dimension 1), a neuron of an MLP
(``[batch, features]`` or ``[batch, tokens, features]``, the last dimension), an attention head
(the heads' outputs side by side in the last dimension, ``head_size`` features each), a channel
of a graph network's layer (``[nodes, features]``, dimension 1). A :class:`Concept` says which
dimension and how indices map to it; it gives

- the **mask** of a set of concept indices ``S``: ``m = 1`` at the positions of the output that
  belong to a concept in ``S``, ``0`` elsewhere (:meth:`Concept.mask`). Conditional relevance
  multiplies the relevance reaching the node's output by it
  (:func:`fxlrp.concepts.conditional_relevance`);
- the **concept relevance** of the node's relevance ``R``: for each sample ``b`` and concept
  ``c``, ``R_c(b) = sum over the positions p of concept c of R(b, p)``, optionally divided by
  ``sum_c' |R_c'(b)| + 1e-10`` (``abs_norm``, as zennit-crp's ``ChannelConcept.attribute``)
  (:meth:`Concept.relevance`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

ABS_NORM_STABILIZER = 1e-10
"""What :meth:`Concept.relevance` adds to the sum of absolute values it divides by (zennit-crp's)."""


class Concept:
    """Concepts along one dimension of a node's output (see the module's docstring).

    Subclasses say how many concepts an output has (:meth:`count`) and which positions along
    :attr:`dim` belong to concept ``c`` (:meth:`positions`); the mask and the concept relevance
    follow.

    Parameters
    ----------
    dim : int
        The dimension of the node's output the concepts are indices of (negative: counted from
        the end). Dimension 0 is the batch (samples; a graph network's nodes) and is never one.
    """

    def __init__(self, dim: int) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"dim must be an int (a dimension of the node's output), got {dim!r}")
        self.dim = dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"

    def _dimension(self, shape: Sequence[int]) -> int:
        """:attr:`dim` as a non-negative index of ``shape``; an error where it is no concept dimension."""
        rank = len(shape)
        dim = self.dim + rank if self.dim < 0 else self.dim
        if rank < 2 or not 1 <= dim < rank:
            raise ValueError(
                f"{self!r} takes concepts along dimension {self.dim} of the node's output, which has shape "
                f"{list(shape)}: dimension 0 is the batch and the concepts need one of dimensions 1 to {rank - 1} "
                "(ChannelConcept(dim=1) for [batch, channels, ...], NeuronConcept() for the last dimension)"
            )
        return dim

    def size(self, shape: Sequence[int]) -> int:
        """The length of the concept dimension of an output of ``shape``.

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.

        Returns
        -------
        int
            ``shape[dim]``.
        """
        return int(shape[self._dimension(shape)])

    def count(self, shape: Sequence[int]) -> int:
        """How many concepts an output of ``shape`` has.

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.

        Returns
        -------
        int
            The number of concepts.
        """
        return self.size(shape)

    def positions(self, shape: Sequence[int]) -> Tensor:
        """The concept of each index along the concept dimension.

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.

        Returns
        -------
        Tensor
            ``[size]`` integers: entry ``i`` is the concept index ``i`` belongs to.
        """
        return torch.arange(self.size(shape))

    def mask(self, shape: Sequence[int], ids: Sequence[int], *, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> Tensor:
        r"""The mask of the concepts ``ids`` for an output of ``shape``.

        ``m[..., i, ...] = 1`` if index ``i`` of the concept dimension belongs to a concept in
        ``ids``, else ``0``; every other dimension has size 1 (it broadcasts over the batch and
        over positions).

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.
        ids : sequence of int
            Concept indices (negative ones count from the end).
        dtype : torch.dtype, default torch.float32
            The mask's dtype.
        device : torch.device or str, optional
            The mask's device.

        Returns
        -------
        Tensor
            The mask, broadcastable to ``shape``.

        Raises
        ------
        ValueError
            For an index out of range, naming the number of concepts.
        """
        dim = self._dimension(shape)
        count = self.count(shape)
        chosen = torch.zeros(count, dtype=torch.bool)
        for index in ids:
            if not -count <= index < count:
                raise ValueError(
                    f"concept {index} does not exist: {self!r} finds {count} concepts in an output of shape "
                    f"{list(shape)} (indices 0 to {count - 1})"
                )
            chosen[index] = True
        values = chosen[self.positions(shape)].to(dtype=dtype, device=device)
        view = [1] * len(shape)
        view[dim] = values.numel()
        return values.reshape(view)

    def relevance(self, relevance: Tensor, abs_norm: bool = False) -> Tensor:
        r"""Concept relevance: the relevance of each concept, per sample.

        For samples ``b`` (dimension 0) and concepts ``c``,

            R_c(b) = sum over the positions p of concept c of R(b, p),

        and with ``abs_norm``, ``R_c(b) / (sum_c' |R_c'(b)| + 1e-10)`` (zennit-crp's
        ``ChannelConcept().attribute(relevance, abs_norm=True)``).

        Parameters
        ----------
        relevance : Tensor
            A node's relevance, batch first (``[batch, ...]``).
        abs_norm : bool, default False
            Divide by the sum of absolute values over the concepts.

        Returns
        -------
        Tensor
            ``[batch, concepts]``.
        """
        shape = relevance.shape
        dim = self._dimension(shape)
        moved = relevance if dim == 1 else relevance.movedim(dim, 1)
        per_index = torch.sum(moved.reshape(*moved.shape[:2], -1), dim=-1)  # zennit-crp's order of sums
        positions = self.positions(shape).to(relevance.device)
        count = self.count(shape)
        if torch.equal(positions, torch.arange(count, device=relevance.device)):
            per_concept = per_index
        else:
            per_concept = per_index.new_zeros(per_index.shape[0], count).index_add_(1, positions, per_index)
        if abs_norm:
            per_concept = per_concept / (torch.abs(per_concept).sum(-1).view(-1, 1) + ABS_NORM_STABILIZER)
        return per_concept


class ChannelConcept(Concept):
    """Each index along ``dim`` is a concept: channels of ``[batch, channels, ...]`` (dim 1).

    zennit-crp's ``ChannelConcept``: a convolution's channels, a linear layer's outputs
    ``[batch, features]``, a graph network layer's channels ``[nodes, channels]``.

    Parameters
    ----------
    dim : int, default 1
        The channel dimension.
    """

    def __init__(self, dim: int = 1) -> None:
        super().__init__(dim)


class NeuronConcept(ChannelConcept):
    """Each feature of the last dimension is a concept: the neurons of an MLP in a transformer
    (``[batch, tokens, features]``), of a linear layer (``[batch, features]``).

    Parameters
    ----------
    dim : int, default -1
        The feature dimension.
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__(dim)


class HeadConcept(Concept):
    r"""Attention heads whose outputs lie side by side along ``dim``: concept ``h`` is the
    ``head_size = size / heads`` features ``h * head_size`` to ``(h + 1) * head_size - 1``.

    Where heads meet the model: the attention's output before its output projection
    (``[batch, tokens, heads * head_size]``: a Hugging Face ``SelfAttention`` module's output, the
    input of ``out_proj``). For heads in a dimension of their own (``[batch, heads, tokens,
    head_size]``) use ``ChannelConcept(dim=1)``.

    Parameters
    ----------
    heads : int
        The number of heads.
    dim : int, default -1
        The dimension holding the heads' features.
    """

    def __init__(self, heads: int, dim: int = -1) -> None:
        super().__init__(dim)
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
            raise ValueError(f"heads must be a positive int, got {heads!r}")
        self.heads = heads

    def __repr__(self) -> str:
        return f"HeadConcept(heads={self.heads}, dim={self.dim})"

    def count(self, shape: Sequence[int]) -> int:
        """The number of heads (the concept dimension must split evenly among them).

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.

        Returns
        -------
        int
            :attr:`heads`.
        """
        size = self.size(shape)
        if size % self.heads:
            raise ValueError(
                f"{self!r}: dimension {self.dim} of the node's output (shape {list(shape)}) has {size} features, "
                f"which do not split into {self.heads} heads of equal size; name the node whose output holds the "
                "heads side by side (the input of the attention's output projection)"
            )
        return self.heads

    def positions(self, shape: Sequence[int]) -> Tensor:
        """The head of each feature: ``i // head_size``.

        Parameters
        ----------
        shape : sequence of int
            The node's output shape, batch first.

        Returns
        -------
        Tensor
            ``[size]`` head indices.
        """
        return torch.arange(self.size(shape)) // (self.size(shape) // self.count(shape))


def concept_relevance(relevance: Tensor, concept: Concept | None = None, abs_norm: bool = False,
                      batch_dim: int = 0) -> Tensor:
    r"""Concept relevance of a node's relevance: ``R_c(b) = sum over the positions p of concept c of R(b, p)``.

    With ``abs_norm``, ``R_c(b) / (sum_c' |R_c'(b)| + 1e-10)``. See :meth:`Concept.relevance`.

    Parameters
    ----------
    relevance : Tensor
        A node's relevance, ``[*leading, batch, *node_shape]``: the dimensions before
        ``batch_dim`` (conditions, targets) are kept as they are.
    concept : Concept, optional
        The concepts; ``ChannelConcept()`` (dimension 1 of ``[batch, ...]``) by default.
    abs_norm : bool, default False
        Divide by ``sum_c |R_c| + 1e-10`` per sample.
    batch_dim : int, default 0
        Where the batch is (1 for the ``[conditions, batch, ...]`` relevance of
        :class:`~fxlrp.concepts.ConditionalRelevance`).

    Returns
    -------
    Tensor
        ``[*leading, batch, concepts]``.
    """
    concept = ChannelConcept() if concept is None else concept
    if not 0 <= batch_dim < relevance.dim():
        raise ValueError(f"batch_dim={batch_dim} is no dimension of a relevance of shape {list(relevance.shape)}")
    leading = relevance.shape[:batch_dim]
    flat = relevance.reshape(-1, *relevance.shape[batch_dim + 1:]) if batch_dim else relevance
    found = concept.relevance(flat, abs_norm=abs_norm)
    return found.reshape(*leading, relevance.shape[batch_dim], found.shape[-1]) if batch_dim else found
