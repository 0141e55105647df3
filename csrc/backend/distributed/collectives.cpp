#include "backend/distributed/collectives.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <numeric>
#include <sstream>

#include "backend/distributed/collective.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"

namespace emugpu {

namespace {

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

int64_t total_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += nbytes(t);
  return n;
}

std::vector<at::Tensor> flatten(const TensorLists& lists) {
  std::vector<at::Tensor> flat;
  for (const auto& l : lists) flat.insert(flat.end(), l.begin(), l.end());
  return flat;
}

std::vector<at::Tensor> joined(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string python_tuple(c10::IntArrayRef values) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << (values.size() == 1 ? ",)" : ")");
  return out.str();
}

// NCCL's rules for a reduction op over these dtypes.
void check_op(const std::string& name, c10d::ReduceOp::RedOpType op, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_NOT_IMPLEMENTED(op != c10d::ReduceOp::PREMUL_SUM, "emu backend: ", name,
                              " with ReduceOp.PREMUL_SUM is not supported yet; scale the tensor and use "
                              "ReduceOp.SUM");
  TORCH_CHECK_VALUE(op < c10d::ReduceOp::PREMUL_SUM, "emu backend: ", name, " expected a ReduceOp, got op ",
                    static_cast<int>(op));
  const bool bitwise = op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
  for (const auto& t : tensors) {
    const bool floating = at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
    TORCH_CHECK_VALUE(!(bitwise && floating), "emu backend: ", name, " with ReduceOp.", op_name(op),
                      " expected an integer or bool dtype, got ", dtype_name(t.scalar_type()));
    TORCH_CHECK_VALUE(op != c10d::ReduceOp::AVG || floating, "emu backend: ", name,
                      " with ReduceOp.AVG expected a floating dtype (as NCCL), got ", dtype_name(t.scalar_type()));
  }
}

std::vector<at::Tensor> hosts_of(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> hosts;
  hosts.reserve(tensors.size());
  for (const auto& t : tensors) hosts.push_back(host_alias(t));
  return hosts;
}

// The tensors' bytes one after the other.
Bytes concat(const std::vector<at::Tensor>& hosts) {
  Bytes out(static_cast<size_t>(total_bytes(hosts)));
  size_t at = 0;
  for (const auto& h : hosts) {
    const auto n = static_cast<size_t>(nbytes(h));
    if (n > 0) std::memcpy(out.data() + at, h.data_ptr(), n);
    at += n;
  }
  return out;
}

// `length` bytes of `host` from byte `offset`.
Bytes slice(const at::Tensor& host, int64_t offset, int64_t length) {
  const auto* p = static_cast<const uint8_t*>(host.data_ptr()) + offset;
  return Bytes(p, p + length);
}

void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

// Checks that `row` from `rank` holds `want` bytes.
void expect_bytes(const std::string& name, const Bytes& row, int rank, int64_t want) {
  TORCH_CHECK(static_cast<int64_t>(row.size()) >= want, "emu backend: ", name, " expected ", want, " bytes from rank ",
              rank, ", got ", row.size(), "; every rank must pass the same shapes");
}

void write(const at::Tensor& host, const uint8_t* bytes) {
  if (nbytes(host) > 0) std::memcpy(host.data_ptr(), bytes, static_cast<size_t>(nbytes(host)));
}

// A CPU tensor shaped and typed as `like`, holding `row`'s bytes from `offset`.
at::Tensor typed(const Bytes& row, int64_t offset, const at::Tensor& like) {
  at::Tensor t = at::empty(like.sizes(), like.options().device(c10::kCPU));
  if (nbytes(t) > 0) std::memcpy(t.data_ptr(), row.data() + offset, static_cast<size_t>(nbytes(t)));
  return t;
}

// Reduces in rank order: every rank computes the same sums in the same order.
at::Tensor reduced(std::vector<at::Tensor> parts, c10d::ReduceOp::RedOpType op, int size) {
  at::Tensor acc = parts[0].clone();
  for (size_t i = 1; i < parts.size(); ++i) reduce_into(acc, parts[i], op);
  if (op == c10d::ReduceOp::AVG) acc.div_(size);
  return acc.contiguous();
}

int64_t framed_bytes(const std::vector<int64_t>& lengths) {
  return 8 * (1 + static_cast<int64_t>(lengths.size())) + std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

CollectiveCall base(const std::string& name, const std::string& kind, double model_bytes, int device) {
  CollectiveCall c;
  c.name = name;
  c.model_kind = kind;
  c.model_bytes = model_bytes;
  c.device = device;
  return c;
}

}  // namespace

int checked_device(const std::string& name, const std::vector<at::Tensor>& tensors) {
  int device = -1;
  for (const auto& t : tensors) {
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, "emu backend: ", name,
                      " expected emugpu tensors, got one on ", t.device(),
                      "; move it with .to('emugpu') or use a 'cpu:gloo,emugpu:emu' process group for CPU tensors");
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided && t.is_contiguous(), "emu backend: ", name,
                      " expected dense contiguous tensors (as NCCL does), got shape ", python_tuple(t.sizes()),
                      " strides ", python_tuple(t.strides()), "; call .contiguous() first");
    TORCH_CHECK_VALUE(device < 0 || t.device().index() == device, "emu backend: ", name,
                      " expected every tensor on one device, got emugpu:", device, " and ", t.device());
    device = t.device().index();
  }
  return device < 0 ? current_device() : device;
}

Work all_reduce(GroupCollectives& g, const std::string& name, const std::vector<at::Tensor>& tensors,
                c10d::ReduceOp::RedOpType op) {
  check_op(name, op, tensors);
  (void)checked_device(name, tensors);
  TORCH_CHECK_VALUE(!tensors.empty(), "emu backend: ", name, " expected at least one tensor, got none");
  return g.all_reduce(name, tensors, op);
}

Work broadcast(GroupCollectives& g, const std::vector<at::Tensor>& tensors, int root) {
  const int device = checked_device("broadcast", tensors);
  const int rank = g.spec().rank;
  const bool is_root = rank == root;
  CollectiveCall c = base("broadcast", "broadcast", static_cast<double>(total_bytes(tensors)), device);
  c.extra = "root " + std::to_string(root);
  if (is_root) {
    c.inputs = tensors;
  } else {
    c.received = tensors;
  }
  c.outputs = c.signed_ = tensors;
  c.payload = is_root ? total_bytes(tensors) : 0;
  auto hosts = hosts_of(tensors);
  c.pack = [hosts, is_root] { return Rows{is_root ? concat(hosts) : Bytes{}}; };
  c.combine = [hosts, is_root, root, name = c.name](Rows& rows) {
    if (is_root) return;
    expect_bytes(name, rows[static_cast<size_t>(root)], root, total_bytes(hosts));
    int64_t at = 0;
    for (const auto& h : hosts) {
      write(h, rows[static_cast<size_t>(root)].data() + at);
      at += nbytes(h);
    }
  };
  return g.run(std::move(c));
}

Work reduce(GroupCollectives& g, const std::vector<at::Tensor>& tensors, int root, c10d::ReduceOp::RedOpType op) {
  check_op("reduce", op, tensors);
  const int device = checked_device("reduce", tensors);
  const int rank = g.spec().rank;
  const int size = g.spec().size;
  CollectiveCall c = base("reduce", "reduce", static_cast<double>(total_bytes(tensors)), device);
  c.extra = "root " + std::to_string(root) + " " + op_name(op);
  c.inputs = c.outputs = c.signed_ = tensors;
  if (rank == root) c.received = tensors;
  c.per_destination = true;
  std::vector<int64_t> lengths(static_cast<size_t>(size), 0);
  lengths[static_cast<size_t>(root)] = total_bytes(tensors);
  c.payload = framed_bytes(lengths);
  auto hosts = hosts_of(tensors);
  c.pack = [hosts, root, size] {
    Rows chunks(static_cast<size_t>(size));
    chunks[static_cast<size_t>(root)] = concat(hosts);
    return chunks;
  };
  c.combine = [hosts, rank, root, size, op, name = c.name](Rows& rows) {
    if (rank != root) return;
    int64_t at = 0;
    for (const auto& h : hosts) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < size; ++r) {
        expect_bytes(name, rows[static_cast<size_t>(r)], r, at + nbytes(h));
        parts.push_back(typed(rows[static_cast<size_t>(r)], at, h));
      }
      h.copy_(reduced(std::move(parts), op, size));
      at += nbytes(h);
    }
  };
  return g.run(std::move(c));
}

Work all_gather(GroupCollectives& g, const TensorLists& outputs, const std::vector<at::Tensor>& inputs,
                const std::string& name) {
  const std::vector<at::Tensor> flat = flatten(outputs);
  const int device = checked_device(name, joined(inputs, flat));
  const int size = g.spec().size;
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "emu backend: ", name, " expected an output list per input (",
                    inputs.size(), "), got ", outputs.size());
  for (const auto& l : outputs) {
    TORCH_CHECK_VALUE(static_cast<int>(l.size()) == size, "emu backend: ", name, " expected ", size,
                      " output tensors per input (one per rank), got ", l.size());
  }
  CollectiveCall c = base(name, "all_gather", static_cast<double>(total_bytes(inputs) * size), device);
  c.inputs = inputs;
  c.received = c.outputs = flat;
  c.signed_ = joined(inputs, flat);
  c.payload = total_bytes(inputs);
  auto in = hosts_of(inputs);
  TensorLists out;
  for (const auto& l : outputs) out.push_back(hosts_of(l));
  c.pack = [in] { return Rows{concat(in)}; };
  c.combine = [in, out, name](Rows& rows) {
    for (size_t r = 0; r < rows.size(); ++r) {
      expect_bytes(name, rows[r], static_cast<int>(r), total_bytes(in));
      int64_t at = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        write(out[i][r], rows[r].data() + at);
        at += nbytes(in[i]);
      }
    }
  };
  return g.run(std::move(c));
}

Work all_gather_into_tensor(GroupCollectives& g, const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::string& name) {
  const int device = checked_device(name, joined(inputs, outputs));
  const int size = g.spec().size;
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "emu backend: ", name, " expected an output per input (",
                    inputs.size(), "), got ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK_VALUE(nbytes(outputs[i]) == nbytes(inputs[i]) * size, "emu backend: ", name, " expected an output of ",
                      size, " times the input's ", nbytes(inputs[i]), " bytes, got ", nbytes(outputs[i]));
  }
  CollectiveCall c = base(name, "all_gather", static_cast<double>(total_bytes(inputs) * size), device);
  c.inputs = inputs;
  c.received = c.outputs = outputs;
  c.signed_ = joined(inputs, outputs);
  c.payload = total_bytes(inputs);
  auto in = hosts_of(inputs);
  auto out = hosts_of(outputs);
  c.pack = [in] { return Rows{concat(in)}; };
  c.combine = [in, out, name](Rows& rows) {
    for (size_t r = 0; r < rows.size(); ++r) {
      expect_bytes(name, rows[r], static_cast<int>(r), total_bytes(in));
      int64_t at = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        const int64_t n = nbytes(in[i]);
        if (n > 0)
          std::memcpy(static_cast<uint8_t*>(out[i].data_ptr()) + static_cast<int64_t>(r) * n, rows[r].data() + at,
                      static_cast<size_t>(n));
        at += n;
      }
    }
  };
  return g.run(std::move(c));
}

Work reduce_scatter(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const TensorLists& inputs,
                    c10d::ReduceOp::RedOpType op) {
  const std::string name = "reduce_scatter";
  check_op(name, op, outputs);
  const std::vector<at::Tensor> flat = flatten(inputs);
  const int device = checked_device(name, joined(flat, outputs));
  const int size = g.spec().size;
  const int rank = g.spec().rank;
  TORCH_CHECK_VALUE(inputs.size() == outputs.size(), "emu backend: ", name, " expected an input list per output (",
                    outputs.size(), "), got ", inputs.size());
  for (const auto& l : inputs) {
    TORCH_CHECK_VALUE(static_cast<int>(l.size()) == size, "emu backend: ", name, " expected ", size,
                      " input tensors per output (one per rank), got ", l.size());
  }
  CollectiveCall c = base(name, "reduce_scatter", static_cast<double>(total_bytes(outputs) * size), device);
  c.extra = op_name(op);
  c.inputs = flat;
  c.received = c.outputs = outputs;
  c.signed_ = joined(flat, outputs);
  c.per_destination = true;
  std::vector<int64_t> lengths(static_cast<size_t>(size), 0);
  TensorLists in;
  for (const auto& l : inputs) in.push_back(hosts_of(l));
  for (int r = 0; r < size; ++r) {
    for (const auto& l : in) lengths[static_cast<size_t>(r)] += nbytes(l[static_cast<size_t>(r)]);
  }
  c.payload = framed_bytes(lengths);
  auto out = hosts_of(outputs);
  c.pack = [in, size] {
    Rows chunks(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (const auto& l : in) append(chunks[static_cast<size_t>(r)], concat({l[static_cast<size_t>(r)]}));
    }
    return chunks;
  };
  c.combine = [out, size, op, name](Rows& rows) {
    int64_t at = 0;
    for (const auto& o : out) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < size; ++r) {
        expect_bytes(name, rows[static_cast<size_t>(r)], r, at + nbytes(o));
        parts.push_back(typed(rows[static_cast<size_t>(r)], at, o));
      }
      o.copy_(reduced(std::move(parts), op, size));
      at += nbytes(o);
    }
  };
  (void)rank;
  return g.run(std::move(c));
}

Work reduce_scatter_tensor(GroupCollectives& g, const std::vector<at::Tensor>& outputs,
                           const std::vector<at::Tensor>& inputs, c10d::ReduceOp::RedOpType op,
                           const std::string& name) {
  check_op(name, op, outputs);
  const int device = checked_device(name, joined(inputs, outputs));
  const int size = g.spec().size;
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "emu backend: ", name, " expected an output per input (",
                    inputs.size(), "), got ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK_VALUE(nbytes(inputs[i]) == nbytes(outputs[i]) * size, "emu backend: ", name, " expected an input of ",
                      size, " times the output's ", nbytes(outputs[i]), " bytes, got ", nbytes(inputs[i]));
  }
  CollectiveCall c = base(name, "reduce_scatter", static_cast<double>(total_bytes(inputs)), device);
  c.extra = op_name(op);
  c.inputs = inputs;
  c.received = c.outputs = outputs;
  c.signed_ = joined(inputs, outputs);
  c.per_destination = true;
  c.payload = framed_bytes(std::vector<int64_t>(static_cast<size_t>(size), total_bytes(outputs)));
  auto in = hosts_of(inputs);
  auto out = hosts_of(outputs);
  c.pack = [in, out, size] {
    Rows chunks(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < in.size(); ++i) {
        append(chunks[static_cast<size_t>(r)], slice(in[i], r * nbytes(out[i]), nbytes(out[i])));
      }
    }
    return chunks;
  };
  c.combine = [out, size, op, name](Rows& rows) {
    int64_t at = 0;
    for (const auto& o : out) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < size; ++r) {
        expect_bytes(name, rows[static_cast<size_t>(r)], r, at + nbytes(o));
        parts.push_back(typed(rows[static_cast<size_t>(r)], at, o));
      }
      o.copy_(reduced(std::move(parts), op, size));
      at += nbytes(o);
    }
  };
  return g.run(std::move(c));
}

Work gather(GroupCollectives& g, const TensorLists& outputs, const std::vector<at::Tensor>& inputs, int root) {
  const std::string name = "gather";
  const std::vector<at::Tensor> flat = flatten(outputs);
  const int device = checked_device(name, joined(inputs, flat));
  const int size = g.spec().size;
  const int rank = g.spec().rank;
  if (rank == root) {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "emu backend: gather expected an output list per input (",
                      inputs.size(), ") on the root, got ", outputs.size());
    for (const auto& l : outputs) {
      TORCH_CHECK_VALUE(static_cast<int>(l.size()) == size, "emu backend: gather expected ", size,
                        " output tensors per input on the root (one per rank), got ", l.size());
    }
  }
  CollectiveCall c = base(name, "gather", static_cast<double>(total_bytes(inputs) * size), device);
  c.extra = "root " + std::to_string(root);
  c.inputs = c.signed_ = inputs;
  c.received = c.outputs = flat;
  c.per_destination = true;
  std::vector<int64_t> lengths(static_cast<size_t>(size), 0);
  lengths[static_cast<size_t>(root)] = total_bytes(inputs);
  c.payload = framed_bytes(lengths);
  auto in = hosts_of(inputs);
  TensorLists out;
  for (const auto& l : outputs) out.push_back(hosts_of(l));
  c.pack = [in, root, size] {
    Rows chunks(static_cast<size_t>(size));
    chunks[static_cast<size_t>(root)] = concat(in);
    return chunks;
  };
  c.combine = [in, out, rank, root, name](Rows& rows) {
    if (rank != root) return;
    for (size_t r = 0; r < rows.size(); ++r) {
      expect_bytes(name, rows[r], static_cast<int>(r), total_bytes(in));
      int64_t at = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        write(out[i][r], rows[r].data() + at);
        at += nbytes(in[i]);
      }
    }
  };
  return g.run(std::move(c));
}

Work scatter(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const TensorLists& inputs, int root) {
  const std::string name = "scatter";
  const std::vector<at::Tensor> flat = flatten(inputs);  // on the root: per output, one chunk per rank
  const int device = checked_device(name, joined(flat, outputs));
  const int size = g.spec().size;
  const int rank = g.spec().rank;
  if (rank == root) {
    TORCH_CHECK_VALUE(inputs.size() == outputs.size(), "emu backend: scatter expected an input list per output (",
                      outputs.size(), ") on the root, got ", inputs.size());
    for (const auto& l : inputs) {
      TORCH_CHECK_VALUE(static_cast<int>(l.size()) == size, "emu backend: scatter expected ", size,
                        " input tensors per output on the root (one per rank), got ", l.size());
    }
  }
  CollectiveCall c = base(name, "scatter", static_cast<double>(total_bytes(outputs) * size), device);
  c.extra = "root " + std::to_string(root);
  c.inputs = flat;
  c.received = c.outputs = c.signed_ = outputs;
  c.per_destination = true;
  std::vector<int64_t> lengths(static_cast<size_t>(size), 0);
  TensorLists in;
  for (const auto& l : inputs) in.push_back(hosts_of(l));
  if (rank == root) {
    for (int r = 0; r < size; ++r) {
      for (const auto& l : in) lengths[static_cast<size_t>(r)] += nbytes(l[static_cast<size_t>(r)]);
    }
  }
  c.payload = framed_bytes(lengths);
  auto out = hosts_of(outputs);
  c.pack = [in, size] {
    Rows chunks(static_cast<size_t>(size));  // empty off the root (it has no inputs)
    for (int r = 0; r < size; ++r) {
      for (const auto& l : in) append(chunks[static_cast<size_t>(r)], concat({l[static_cast<size_t>(r)]}));
    }
    return chunks;
  };
  c.combine = [out, root, name](Rows& rows) {
    expect_bytes(name, rows[static_cast<size_t>(root)], root, total_bytes(out));
    int64_t at = 0;
    for (const auto& o : out) {
      write(o, rows[static_cast<size_t>(root)].data() + at);
      at += nbytes(o);
    }
  };
  return g.run(std::move(c));
}

namespace {
// Byte lengths of a tensor's rank-by-rank chunks along dim 0 (equal when `splits` is empty).
std::vector<int64_t> cuts(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* which) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 0;
  const int64_t per_row = rows > 0 ? nbytes(t) / rows : 0;
  std::vector<int64_t> out;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, "emu backend: all_to_all_single expected the ", which, "'s first dimension (",
                      rows, ") to divide by the group size (", size, ") when no split sizes are given");
    out.assign(static_cast<size_t>(size), rows / size * per_row);
    return out;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, "emu backend: all_to_all_single expected ", size, " ",
                    which, " split sizes, got ", splits.size());
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, "emu backend: all_to_all_single expected split sizes >= 0, got ", s);
    sum += s;
    out.push_back(s * per_row);
  }
  TORCH_CHECK_VALUE(sum == rows, "emu backend: all_to_all_single expected the ", which,
                    " split sizes to add up to its first dimension (", rows, "), got ", sum);
  return out;
}
}  // namespace

Work all_to_all_single(GroupCollectives& g, const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  const std::string name = "all_to_all_single";
  const int device = checked_device(name, {input, output});
  const int size = g.spec().size;
  const std::vector<int64_t> sent = cuts(input, input_splits, size, "input");
  const std::vector<int64_t> got = cuts(output, output_splits, size, "output");
  CollectiveCall c = base(name, "all_to_all", static_cast<double>(nbytes(input)), device);
  c.extra = dtype_name(input.scalar_type());
  c.inputs = {input};
  c.received = c.outputs = {output};
  c.per_destination = true;
  c.payload = framed_bytes(sent);
  const at::Tensor in = host_alias(input);
  const at::Tensor out = host_alias(output);
  c.pack = [in, sent] {
    Rows chunks;
    int64_t at = 0;
    for (int64_t n : sent) {
      chunks.push_back(slice(in, at, n));
      at += n;
    }
    return chunks;
  };
  c.combine = [out, got, name](Rows& rows) {
    int64_t at = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      TORCH_CHECK(static_cast<int64_t>(rows[r].size()) == got[r], "emu backend: ", name, " expected ", got[r],
                  " bytes from rank ", r, " (the output split sizes), got ", rows[r].size(),
                  "; each rank's output split for a peer must match that peer's input split");
      if (got[r] > 0)
        std::memcpy(static_cast<uint8_t*>(out.data_ptr()) + at, rows[r].data(), static_cast<size_t>(got[r]));
      at += got[r];
    }
  };
  return g.run(std::move(c));
}

Work all_to_all(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  const std::string name = "all_to_all";
  const int device = checked_device(name, joined(inputs, outputs));
  const int size = g.spec().size;
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size && static_cast<int>(outputs.size()) == size,
                    "emu backend: all_to_all expected an input and an output tensor per rank (", size, "), got ",
                    inputs.size(), " and ", outputs.size());
  CollectiveCall c = base(name, "all_to_all", static_cast<double>(total_bytes(inputs)), device);
  c.extra = inputs.empty() ? "None" : dtype_name(inputs[0].scalar_type());
  c.inputs = inputs;
  c.received = c.outputs = outputs;
  c.per_destination = true;
  std::vector<int64_t> lengths;
  for (const auto& t : inputs) lengths.push_back(nbytes(t));
  c.payload = framed_bytes(lengths);
  auto in = hosts_of(inputs);
  auto out = hosts_of(outputs);
  c.pack = [in] {
    Rows chunks;
    for (const auto& h : in) chunks.push_back(concat({h}));
    return chunks;
  };
  c.combine = [out, name](Rows& rows) {
    for (size_t r = 0; r < rows.size(); ++r) {
      TORCH_CHECK(static_cast<int64_t>(rows[r].size()) == nbytes(out[r]), "emu backend: ", name, " expected ",
                  nbytes(out[r]), " bytes from rank ", r, ", got ", rows[r].size(),
                  "; each rank's output for a peer must match that peer's input for it");
      write(out[r], rows[r].data());
    }
  };
  return g.run(std::move(c));
}

Work barrier(GroupCollectives& g, int device) {
  CollectiveCall c = base("barrier", "barrier", 4, device);
  c.blocks_host = true;
  c.pack = [] { return Rows{Bytes{}}; };
  c.combine = [](Rows&) {};
  return g.run(std::move(c));
}

}  // namespace emugpu
