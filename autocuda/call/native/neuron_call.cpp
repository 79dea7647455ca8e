// autocuda's native call path: a program's neuron call (autocuda/program.py) as one C++ operator whose autograd
// node is C++ too, so that neither the forward nor the backward of a small call runs Python between torch and the
// kernel launch. Python works out everything a call of one key needs (the kernels bound to its shape, where each
// argument comes from, what to save) and hands it over once as a plan; a call then allocates, fills the argument
// slots, launches and, when x requires grad, records the node.
//
// Rules this file follows:
// - A plan is immutable once made; identical plans are one plan, so a program that prepares the same call again
//   adds nothing. Python holds plans by number (`make_plan` counts a holder, `release_plan` drops one): the last
//   holder's release frees the number for another plan, while a call in flight or an autograd node that refers to
//   the plan keeps it alive (shared ownership), so memory follows the plans in use, not every shape ever seen.
// - Every index a plan holds is checked when it is made, never on the hot path.
// - Kernels launch on torch's current stream of the tensors' device (in backward, the stream autograd gives the
//   node: its forward's), in the device's primary context, as the Python launcher does.
// - The torch headers declare only the operators this file calls (at::empty, at::zeros: their per-operator
//   headers, as torch's own sources include them), not all of ATen's thousands, which the autograd headers would
//   otherwise pull in (most of the library's build time is spent reading headers).
#define AT_PER_OPERATOR_HEADERS
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::variable_list;

// Where a kernel argument's value comes from, and how it is written into its 8-byte slot.
enum Source : int64_t { kConstant = 0, kOutput = 1, kTensor = 2, kNumber = 3 };
enum SlotType : int64_t { kF32 = 0, kF64 = 1, kI64 = 2, kI32 = 3, kU32 = 4, kU8 = 5 };
enum Runner : int64_t { kNone = 0, kCuda = 1, kHost = 2 };
// an output's rows: one value per neuron; a final state; a flat output of a number of values the next word gives
constexpr int64_t kVector = -1, kFinal = -2, kFlat = -3;

using CuLaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void**, void**);
using CuCtxGetCurrent = int (*)(void**);
using CuCtxSetCurrent = int (*)(void*);
using CuCtxPushCurrent = int (*)(void*);
using CuCtxPopCurrent = int (*)(void**);
using HostLaunch = void (*)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**);

struct Driver {
  CuLaunchKernel launch = nullptr;
  CuCtxGetCurrent get_current = nullptr;
  CuCtxSetCurrent set_current = nullptr;
  CuCtxPushCurrent push_current = nullptr;
  CuCtxPopCurrent pop_current = nullptr;
};

struct Output {
  int64_t rows;  // -1: one value per neuron [N]; -2: a final state, [N] or the call's neuron shape; -3: [numel];
                 // r >= 0: [r, N]
  int64_t numel;
  at::ScalarType dtype;
};

struct Slot {
  int64_t source, value, type;
};

struct Launch {
  int64_t runner = kNone;
  int64_t function = 0, context = 0, grid = 0, block = 0;
  std::vector<Output> outputs;
  std::vector<Slot> slots;
  int64_t tensors = 0;  // tensors the call gives (forward: x, its states; backward: the gradients, the saved ones)
};

// A call gives x ([steps, *], or for a single step (steps = kSingle) the neuron shape), then its initial states
// where they are tensors ([N] each) and its tensor parameters ([1] or [N], in the compute dtype): the plan's
// `inputs` after x, each of `input_numels` values (kVector: N) and its dtype; numbers otherwise.
constexpr int64_t kSingle = -1;

struct Plan {
  Launch forward, backward, backward_finals;  // backward_finals: runner kNone where the call writes no final state
  int64_t steps = 0, neurons = 0, numbers = 0, inputs = 1, alignment = 0;  // alignment: the call tensors' ORed
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool trains = false;
  int64_t spike_at = 0;
  std::vector<int64_t> finals, saved, hidden;  // saved: positions in (the call's tensors, *forward outputs)
  std::vector<int64_t> input_numels;  // of each input after x
  std::vector<at::ScalarType> input_dtypes;
  // of each backward launch: where each input's gradient stands among its outputs (-1: none), x's first; and
  // whether an input's gradient is the sum of partials (a parameter of one value: one per group of neurons)
  std::vector<int64_t> grads, grads_finals, sums;
  Driver driver;
};

using PlanPointer = std::shared_ptr<const Plan>;

// The registry: by number, each plan (null where the number is free), its Python holders and its words; the
// numbers of identical words.
struct Held {
  PlanPointer plan;
  int64_t holders = 0;
  std::vector<int64_t> words;
};
std::mutex registry_lock;
std::vector<Held> plans;
std::vector<int64_t> free_numbers;
std::map<std::vector<int64_t>, int64_t> plan_numbers;

// Reads a plan's words in order, refusing any read past the end.
struct Reader {
  const std::vector<int64_t>& words;
  size_t at = 0;
  int64_t next() {
    TORCH_CHECK(at < words.size(), "autocuda native plan: ", words.size(), " words end early");
    return words[at++];
  }
  std::vector<int64_t> list() {
    int64_t count = next();
    TORCH_CHECK(count >= 0 && count <= 4096, "autocuda native plan: a list of ", count, " entries");
    std::vector<int64_t> items;
    for (int64_t i = 0; i < count; ++i) items.push_back(next());
    return items;
  }
};

Launch read_launch(Reader& in, const std::vector<at::ScalarType>& dtypes, int64_t numbers) {
  Launch launch;
  launch.runner = in.next();
  TORCH_CHECK(launch.runner >= kNone && launch.runner <= kHost, "autocuda native plan: runner ", launch.runner);
  launch.function = in.next();
  launch.context = in.next();
  launch.grid = in.next();
  launch.block = in.next();
  launch.tensors = in.next();
  TORCH_CHECK(launch.grid > 0 && launch.grid < (int64_t(1) << 31) && launch.block > 0 && launch.block <= 1024,
              "autocuda native plan: grid ", launch.grid, ", block ", launch.block);
  TORCH_CHECK(launch.runner == kNone || launch.function != 0, "autocuda native plan: no kernel function");
  int64_t outputs = in.next();
  TORCH_CHECK(outputs >= 0 && outputs <= 64, "autocuda native plan: ", outputs, " outputs");
  for (int64_t i = 0; i < outputs; ++i) {
    int64_t rows = in.next();
    int64_t numel = rows == kFlat ? in.next() : 0;
    int64_t dtype = in.next();
    TORCH_CHECK(rows >= kFlat && numel >= 0 && dtype >= 0 && dtype < int64_t(dtypes.size()),
                "autocuda native plan: output ", i);
    launch.outputs.push_back({rows, numel, dtypes[dtype]});
  }
  int64_t slots = in.next();
  TORCH_CHECK(slots >= 0 && slots <= 256, "autocuda native plan: ", slots, " slots");
  for (int64_t i = 0; i < slots; ++i) {
    Slot slot{in.next(), in.next(), in.next()};
    TORCH_CHECK(slot.type >= kF32 && slot.type <= kU8, "autocuda native plan: slot ", i, " of type ", slot.type);
    int64_t limit = slot.source == kOutput ? outputs : slot.source == kTensor ? launch.tensors
                    : slot.source == kNumber ? numbers : -1;
    TORCH_CHECK(slot.source == kConstant || (slot.value >= 0 && slot.value < limit),
                "autocuda native plan: slot ", i, " reads source ", slot.source, " at ", slot.value);
    launch.slots.push_back(slot);
  }
  return launch;
}

void check_positions(const std::vector<int64_t>& positions, int64_t limit, const char* what) {
  for (int64_t at : positions) {
    TORCH_CHECK(at >= 0 && at < limit, "autocuda native plan: ", what, " at ", at, " of ", limit);
  }
}

void check_gradients(const std::vector<int64_t>& positions, int64_t limit) {  // -1: an input without a gradient
  for (int64_t at : positions) {
    TORCH_CHECK(at >= -1 && at < limit, "autocuda native plan: gradient at ", at, " of ", limit);
  }
}

std::unique_ptr<Plan> read_plan(const std::vector<int64_t>& words, const std::vector<at::ScalarType>& dtypes) {
  Reader in{words};
  auto plan = std::make_unique<Plan>();
  plan->steps = in.next();
  plan->neurons = in.next();
  plan->numbers = in.next();
  plan->inputs = in.next();
  plan->alignment = in.next();
  TORCH_CHECK(plan->steps >= kSingle && plan->neurons >= 0 && plan->inputs >= 1 && plan->inputs <= 64,
              "autocuda native plan: steps ", plan->steps, ", neurons ", plan->neurons, ", inputs ", plan->inputs);
  int64_t dtype = in.next();
  TORCH_CHECK(dtype >= 0 && dtype < int64_t(dtypes.size()), "autocuda native plan: dtype ", dtype);
  plan->dtype = dtypes[dtype];
  int64_t device = in.next();
  plan->device = device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  plan->trains = in.next() != 0;
  plan->spike_at = in.next();
  plan->finals = in.list();
  plan->saved = in.list();
  plan->hidden = in.list();
  std::vector<int64_t> inputs = in.list();  // numel (kVector: N) and dtype of each input after x
  TORCH_CHECK(int64_t(inputs.size()) == 2 * (plan->inputs - 1), "autocuda native plan: ", inputs.size(),
              " words for ", plan->inputs - 1, " inputs after x");
  for (size_t i = 0; i < inputs.size(); i += 2) {
    TORCH_CHECK(inputs[i] >= kVector && inputs[i + 1] >= 0 && inputs[i + 1] < int64_t(dtypes.size()),
                "autocuda native plan: input ", i / 2 + 1);
    plan->input_numels.push_back(inputs[i]);
    plan->input_dtypes.push_back(dtypes[inputs[i + 1]]);
  }
  plan->grads = in.list();
  plan->grads_finals = in.list();
  plan->sums = in.list();
  plan->driver.launch = reinterpret_cast<CuLaunchKernel>(in.next());
  plan->driver.get_current = reinterpret_cast<CuCtxGetCurrent>(in.next());
  plan->driver.set_current = reinterpret_cast<CuCtxSetCurrent>(in.next());
  plan->driver.push_current = reinterpret_cast<CuCtxPushCurrent>(in.next());
  plan->driver.pop_current = reinterpret_cast<CuCtxPopCurrent>(in.next());
  plan->forward = read_launch(in, dtypes, plan->numbers);
  int64_t produced = plan->forward.outputs.size();
  check_positions({plan->spike_at}, produced, "spikes");
  check_positions(plan->finals, produced, "final state");
  check_positions(plan->hidden, produced, "hidden output");
  check_positions(plan->saved, plan->inputs + produced, "saved tensor");
  TORCH_CHECK(plan->forward.tensors == plan->inputs, "autocuda native plan: the forward takes ", plan->forward.tensors,
              " tensors of a call that gives ", plan->inputs);
  if (plan->trains) {
    TORCH_CHECK(int64_t(plan->grads.size()) == plan->inputs && int64_t(plan->sums.size()) == plan->inputs,
                "autocuda native plan: ", plan->grads.size(), " gradients for ", plan->inputs, " inputs");
    plan->backward = read_launch(in, dtypes, plan->numbers);
    check_gradients(plan->grads, plan->backward.outputs.size());
    if (!plan->finals.empty()) {
      TORCH_CHECK(plan->grads_finals.size() == plan->grads.size(), "autocuda native plan: gradients with finals");
      plan->backward_finals = read_launch(in, dtypes, plan->numbers);
      check_gradients(plan->grads_finals, plan->backward_finals.outputs.size());
    }
  }
  TORCH_CHECK(in.at == words.size(), "autocuda native plan: ", words.size() - in.at, " words left over");
  bool cuda = plan->device.is_cuda();
  for (const Launch* launch : {&plan->forward, &plan->backward, &plan->backward_finals}) {
    TORCH_CHECK(launch->runner == kNone || (launch->runner == kCuda) == cuda,
                "autocuda native plan: a launch's runner does not match the device");
  }
  TORCH_CHECK(!cuda || (plan->driver.launch && plan->driver.get_current && plan->driver.set_current &&
                        plan->driver.push_current && plan->driver.pop_current),
              "autocuda native plan: a CUDA plan without the driver's functions");
  return plan;
}

PlanPointer plan_numbered(int64_t number) {
  std::lock_guard<std::mutex> guard(registry_lock);
  TORCH_CHECK(number >= 0 && number < int64_t(plans.size()) && plans[number].plan, "autocuda native: no plan ",
              number);
  return plans[number].plan;
}

void check_driver(int status, const char* call) {
  TORCH_CHECK(status == 0, "autocuda native: ", call, " failed with CUDA driver status ", status);
}

void launch_cuda(const Plan& plan, const Launch& launch, void** pointers) {
  const Driver& driver = plan.driver;
  auto stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(plan.device).native_handle();
  void* current = nullptr;
  check_driver(driver.get_current(&current), "cuCtxGetCurrent");
  void* context = reinterpret_cast<void*>(launch.context);
  bool pushed = false;
  if (current == nullptr) {  // a thread without a context yet: make the device's primary one current
    check_driver(driver.set_current(context), "cuCtxSetCurrent");
  } else if (current != context) {  // another device's context: use this one for the launch only
    check_driver(driver.push_current(context), "cuCtxPushCurrent");
    pushed = true;
  }
  int status = driver.launch(reinterpret_cast<void*>(launch.function), unsigned(launch.grid), 1, 1,
                             unsigned(launch.block), 1, 1, 0, stream, pointers, nullptr);
  if (pushed) {
    void* popped = nullptr;
    check_driver(driver.pop_current(&popped), "cuCtxPopCurrent");
  }
  check_driver(status, "cuLaunchKernel");
}

// Allocates the launch's outputs, fills its slots from the call's tensors and numbers, and launches. The final
// states are allocated in `final_sizes` (the call's neuron shape: N values, which the kernel writes through their
// contiguous address) where it is not empty, else as [N]: a tensor of the neuron shape, not a view of a flat one,
// is one that its holder can detach in place (SpikingJelly's `detach_()`).
std::vector<at::Tensor> run(const Plan& plan, const Launch& launch, const std::vector<at::Tensor>& tensors,
                            const std::vector<double>& numbers, at::IntArrayRef final_sizes = {}) {
  std::vector<at::Tensor> outputs;
  outputs.reserve(launch.outputs.size());
  auto options = at::TensorOptions().device(plan.device);
  for (const Output& output : launch.outputs) {
    auto shaped = options.dtype(output.dtype);
    if (output.rows >= 0) {
      outputs.push_back(at::empty({output.rows, plan.neurons}, shaped));
    } else if (output.rows == kFlat) {
      outputs.push_back(at::empty({output.numel}, shaped));
    } else if (output.rows == kFinal && !final_sizes.empty()) {
      outputs.push_back(at::empty(final_sizes, shaped));
    } else {
      outputs.push_back(at::empty({plan.neurons}, shaped));
    }
  }
  std::vector<uint64_t> slots(launch.slots.size(), 0);
  std::vector<void*> pointers(launch.slots.size());
  for (size_t i = 0; i < launch.slots.size(); ++i) {
    const Slot& slot = launch.slots[i];
    void* into = &slots[i];
    pointers[i] = into;
    if (slot.source == kOutput || slot.source == kTensor) {
      const at::Tensor& tensor = slot.source == kOutput ? outputs[slot.value] : tensors[slot.value];
      uint64_t address = reinterpret_cast<uint64_t>(tensor.data_ptr());
      std::memcpy(into, &address, 8);
      continue;
    }
    double number = slot.source == kNumber ? numbers[slot.value] : double(slot.value);
    switch (slot.type) {
      case kF32: { float v = float(number); std::memcpy(into, &v, 4); break; }
      case kF64: { std::memcpy(into, &number, 8); break; }
      case kI64: { int64_t v = slot.source == kConstant ? slot.value : int64_t(number); std::memcpy(into, &v, 8); break; }
      case kI32: { int32_t v = int32_t(number); std::memcpy(into, &v, 4); break; }
      case kU32: { uint32_t v = uint32_t(number); std::memcpy(into, &v, 4); break; }
      default: { uint8_t v = uint8_t(number != 0.0); std::memcpy(into, &v, 1); break; }
    }
  }
  if (launch.runner == kCuda) {
    launch_cuda(plan, launch, pointers.data());
  } else if (launch.runner == kHost) {
    reinterpret_cast<HostLaunch>(launch.function)(unsigned(launch.grid), 1, 1, unsigned(launch.block), 1, 1,
                                                  pointers.data());
  }
  return outputs;
}

// A tensor the kernel may read as the plan's layout assumes: contiguous, of the plan's shape and dtype, with the
// address alignment the layout was chosen for (a fresh allocation otherwise).
at::Tensor readable(const at::Tensor& grad, at::IntArrayRef sizes, const Plan& plan) {
  if (!grad.defined()) return at::zeros(sizes, at::TensorOptions().device(plan.device).dtype(plan.dtype));
  at::Tensor dense = grad.contiguous();
  if (reinterpret_cast<uint64_t>(dense.data_ptr()) & 15) dense = dense.clone();
  return dense;
}

// A new autograd node: torch owns nodes by std::shared_ptr before 2.12, by c10::intrusive_ptr from then on
// (`Node::getptr` returns the owner's kind in both).
using NodePointer = decltype(std::declval<torch::autograd::Node&>().getptr());
template <typename T, typename... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// A training call's autograd node, a plain torch::autograd::Node as torch's own backward nodes are (not a
// torch::autograd::Function, whose templates would be a third of the library's build): the backward runs the
// plan's backward launch, with the final states' gradients where any arrived, on the tensors the forward saved.
// Its inputs are the call's outputs in order; an output it does not differentiate (`Plan::hidden`) holds its slot,
// undefined.
struct NeuronCallBackward final : torch::autograd::Node {
  PlanPointer plan_held;  // alive while the node is, whatever the holders in Python do
  std::vector<double> numbers;
  std::vector<torch::autograd::SavedVariable> saved;
  std::vector<std::vector<int64_t>> shapes;  // of x as the kernels read it, then of each state

  std::string name() const override { return "autocuda::NeuronCallBackward"; }

  // As torch's own nodes: the saved variables drop their data but stay, so that a second backward without
  // retain_graph unpacks one and raises torch's error (an emptied list let `apply` read past the tensors it built).
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kept : saved) kept.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const Plan& plan = *plan_held;
    bool finals = false;
    for (int64_t at : plan.finals) finals = finals || grads[at].defined();
    std::vector<int64_t> rows{plan.neurons};
    if (plan.steps != kSingle) rows.insert(rows.begin(), plan.steps);
    std::vector<at::Tensor> tensors{readable(grads[plan.spike_at], rows, plan)};
    if (finals) {
      for (int64_t at : plan.finals) tensors.push_back(readable(grads[at], {plan.neurons}, plan));
    }
    NodePointer self = getptr();
    for (const auto& kept : saved) tensors.push_back(kept.unpack(self));
    const Launch& launch = finals ? plan.backward_finals : plan.backward;
    std::vector<at::Tensor> produced = run(plan, launch, tensors, numbers);
    variable_list out;
    for (size_t i = 0; i < plan.grads.size(); ++i) {  // each input's gradient, in its shape (x's first)
      int64_t at = (finals ? plan.grads_finals : plan.grads)[i];
      if (at < 0 || !task_should_compute_output(i)) {
        out.emplace_back();
        continue;
      }
      at::Tensor grad = plan.sums[i] ? at::sum(produced[at], {0}, true) : produced[at];
      out.push_back(grad.view(shapes[i]));
    }
    if (at::GradMode::is_enabled()) {  // create_graph: a second derivative must fail loudly
      // One failing node is every gradient's history, and it leads to this node's inputs: a second derivative
      // toward them (autograd.grad(g, x) runs only the nodes on a path to x) runs it and raises, rather than
      // leave it off every path and miss its terms silently (torch's own once_differentiable does).
      auto fail = make_node<torch::autograd::Error>(
          std::string("autocuda kernels are differentiable once: a second derivative (double backward) through them "
                      "is not available; use backend='reference' for higher-order gradients"),
          torch::autograd::edge_list(next_edges()));
      for (at::Tensor& grad : out) {
        if (!grad.defined()) continue;
        at::Tensor failing = grad.tensor_data();  // the values, without autograd's record of them
        torch::autograd::create_gradient_edge(failing, fail);
        grad = failing;
      }
    }
    return out;
  }
};

// A training call's outputs (x fits the plan), run without recording, then, where x records a graph, given the node:
// the differentiable outputs take it as their history, and it saves what its backward reads (x and outputs).
variable_list recorded_call(const PlanPointer& held, const std::vector<at::Tensor>& inputs,
                            const std::vector<double>& numbers, at::IntArrayRef final_sizes) {
  const Plan& plan = *held;
  variable_list outputs;
  {
    at::AutoGradMode off(false);
    outputs = run(plan, plan.forward, inputs, numbers, final_sizes);
  }
  bool records = false;
  for (const at::Tensor& input : inputs) records = records || input.requires_grad();
  if (!(at::GradMode::is_enabled() && records)) return outputs;
  auto node = make_node<NeuronCallBackward>();
  node->plan_held = held;
  node->numbers = numbers;
  for (const at::Tensor& input : inputs) node->shapes.push_back(input.sizes().vec());
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  std::vector<bool> hidden(outputs.size(), false);
  for (int64_t at : plan.hidden) hidden[at] = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (hidden[i]) {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    } else {
      torch::autograd::set_history(outputs[i], node);
    }
  }
  const int64_t given = plan.inputs;
  for (int64_t at : plan.saved) {  // an output that has this node as its history is saved as its output
    node->saved.emplace_back(at < given ? inputs[at] : outputs[at - given], at >= given && !hidden[at - given]);
  }
  return outputs;
}

// A holder's number of the plan of `words`: the plan already made from them, or a new one.
int64_t make_plan(std::vector<int64_t> words, std::vector<at::ScalarType> dtypes) {
  PlanPointer plan = read_plan(words, dtypes);
  std::lock_guard<std::mutex> guard(registry_lock);
  auto found = plan_numbers.find(words);
  if (found != plan_numbers.end()) {
    plans[found->second].holders += 1;
    return found->second;
  }
  int64_t number = int64_t(plans.size());
  if (free_numbers.empty()) {
    plans.emplace_back();
  } else {
    number = free_numbers.back();
    free_numbers.pop_back();
  }
  plans[number] = Held{std::move(plan), 1, words};
  plan_numbers.emplace(std::move(words), number);
  return number;
}

// A holder lets go of its number: the last one frees it (calls in flight and nodes keep the plan they hold).
void release_plan(int64_t number) {
  std::lock_guard<std::mutex> guard(registry_lock);
  TORCH_CHECK(number >= 0 && number < int64_t(plans.size()) && plans[number].holders > 0,
              "autocuda native: plan ", number, " has no holder to release");
  Held& held = plans[number];
  if (--held.holders > 0) return;
  plan_numbers.erase(held.words);
  held = Held{};
  free_numbers.push_back(number);
}

// How many plans have holders (`native.live_plans`).
int64_t live_plans() {
  std::lock_guard<std::mutex> guard(registry_lock);
  return int64_t(plans.size() - free_numbers.size());
}

// Whether x and the other inputs are tensors the plan's kernels were bound for: x [steps, *] (a single step's: the
// neuron shape) of the plan's neuron count and dtype, the others of their element count and dtype (the kernels read
// them through their addresses), all on the plan's device, contiguous, with the alignment the layout was chosen for.
bool fits(const Plan& plan, const at::Tensor& x, const std::vector<at::Tensor>& others) {
  bool single = plan.steps == kSingle;
  if (!(single || (x.dim() >= 2 && x.size(0) == plan.steps)) ||
      x.numel() != (single ? 1 : plan.steps) * plan.neurons || int64_t(others.size()) + 1 != plan.inputs) {
    return false;
  }
  uint64_t addresses = reinterpret_cast<uint64_t>(x.data_ptr());
  for (size_t i = 0; i < others.size(); ++i) {
    const at::Tensor& other = others[i];
    int64_t numel = plan.input_numels[i] == kVector ? plan.neurons : plan.input_numels[i];
    if (other.numel() != numel || other.scalar_type() != plan.input_dtypes[i] ||
        other.device() != plan.device || !other.is_contiguous()) {
      return false;
    }
    addresses |= reinterpret_cast<uint64_t>(other.data_ptr());
  }
  return x.scalar_type() == plan.dtype && x.device() == plan.device && x.is_contiguous() &&
         int64_t(addresses & 15) == plan.alignment;
}

// The plan's forward outputs for x and the other inputs (which fit the plan): the kernels run on x as
// [steps, neurons] rows (a single step's as [neurons]), and the final states come out in x's neuron shape.
std::vector<at::Tensor> run_call(int64_t number, const PlanPointer& held, const at::Tensor& x,
                                 const std::vector<at::Tensor>& others, const std::vector<double>& numbers) {
  const Plan& plan = *held;
  TORCH_CHECK(int64_t(numbers.size()) == plan.numbers, "autocuda native: plan ", number, " takes ", plan.numbers,
              " numbers, got ", numbers.size());
  bool single = plan.steps == kSingle;
  bool flat = x.dim() == (single ? 1 : 2);
  std::vector<at::Tensor> inputs{flat ? x : single ? x.view({plan.neurons}) : x.view({plan.steps, plan.neurons})};
  inputs.insert(inputs.end(), others.begin(), others.end());
  at::IntArrayRef final_sizes = flat ? at::IntArrayRef() : single ? x.sizes() : x.sizes().slice(1);
  if (!plan.trains) return run(plan, plan.forward, inputs, numbers, final_sizes);
  return recorded_call(held, inputs, numbers, final_sizes);
}

// A program's call: the forward outputs for x [steps, *] (or a single step's x) and the other inputs (the initial
// states where they are tensors, [N] each; the tensor parameters), the sequences as [steps, neurons] rows (a single
// step's as [neurons]), the final states in x's neuron shape.
std::vector<at::Tensor> call(int64_t number, const at::Tensor& x, std::vector<at::Tensor> others,
                             std::vector<double> numbers) {
  PlanPointer held = plan_numbered(number);
  TORCH_CHECK(fits(*held, x, others), "autocuda native: x ", x.sizes(), " ", x.scalar_type(), " on ", x.device(),
              " with ", others.size(), " more tensor(s) is not the call plan ", number, " was made for");
  return run_call(number, held, x, others, numbers);
}

// A layer's keyed call (nn.Neuron), multi-step or single, from states of numbers or tensors (`others`: each [N]
// values of the neuron shape): the spikes in x's shape, then each final state in x's neuron shape. Tensors the plan
// does not fit, or a call that records a graph where the plan's does not (or the reverse), get no results: the
// layer takes its full path. Two entries, so that a call from numbers passes no empty list through the
// dispatcher.
std::vector<at::Tensor> keyed_call(int64_t number, const at::Tensor& x, const std::vector<at::Tensor>& others,
                                   const std::vector<double>& numbers) {
  PlanPointer held = plan_numbered(number);
  const Plan& plan = *held;
  bool graph = x.requires_grad();
  for (const at::Tensor& other : others) graph = graph || other.requires_grad();
  if (!fits(plan, x, others) || (at::GradMode::is_enabled() && graph) != plan.trains) return {};
  std::vector<at::Tensor> outputs = run_call(number, held, x, others, numbers);
  bool flat = x.dim() == (plan.steps == kSingle ? 1 : 2);
  std::vector<at::Tensor> results{flat ? outputs[plan.spike_at] : outputs[plan.spike_at].view(x.sizes())};
  for (int64_t at : plan.finals) results.push_back(outputs[at]);
  return results;
}

std::vector<at::Tensor> layer_call(int64_t number, const at::Tensor& x, std::vector<double> numbers) {
  return keyed_call(number, x, {}, numbers);
}

std::vector<at::Tensor> layer_call_states(int64_t number, const at::Tensor& x, std::vector<at::Tensor> states,
                                          std::vector<double> numbers) {
  return keyed_call(number, x, states, numbers);
}

// An op's implementation (`autocuda::neuron_*` under torch.compile, whose autograd is the op's): the one launch of a
// plan that does not train, on x and the other inputs as the op takes them, its outputs allocated flat; none where
// they do not fit the plan (the Python launch then runs the call, and names what is wrong).
std::vector<at::Tensor> op_call(int64_t number, const at::Tensor& x, std::vector<at::Tensor> others,
                                std::vector<double> numbers) {
  PlanPointer held = plan_numbered(number);
  const Plan& plan = *held;
  if (plan.trains || !fits(plan, x, others) || int64_t(numbers.size()) != plan.numbers) return {};
  std::vector<at::Tensor> inputs{x};
  inputs.insert(inputs.end(), others.begin(), others.end());
  return run(plan, plan.forward, inputs, numbers);
}

}  // namespace

TORCH_LIBRARY(autocuda_native, m) {
  m.def("make_plan(int[] words, ScalarType[] dtypes) -> int", &make_plan);
  m.def("release_plan(int plan) -> ()", &release_plan);
  m.def("live_plans() -> int", &live_plans);
  m.def("call(int plan, Tensor x, Tensor[] others, float[] numbers) -> Tensor[]", &call);
  m.def("layer_call(int plan, Tensor x, float[] numbers) -> Tensor[]", &layer_call);
  m.def("layer_call_states(int plan, Tensor x, Tensor[] states, float[] numbers) -> Tensor[]", &layer_call_states);
  m.def("op_call(int plan, Tensor x, Tensor[] others, float[] numbers) -> Tensor[]", &op_call);
}
