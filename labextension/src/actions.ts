/**
 * The kernel actions, in one table: what the button says, what the confirmation warns, and
 * the route the server takes (`POST /gpuctx/api/kernels/<id>/<api>`). The panel's buttons, the
 * confirmation dialog and the API call all read it, so they cannot drift apart.
 */
import { KernelAction } from './types';

export interface IKernelActionSpec {
  action: KernelAction;
  /** The button's text and the dialog's verb: "Shut down". */
  verb: string;
  /** What it does to whom, before the notebook's name: "Shut down the kernel of". */
  phrase: string;
  /** The dialog's title: "Shut down kernel?". */
  title: string;
  /** What the confirmation warns will happen. */
  warning: string;
  /** The last segment of the server's route. */
  api: string;
  /** Variables or a running cell may be lost: the dialog's button is a warning one. */
  destructive: boolean;
  /**
   * Only for kernels that hold cached GPU memory or are idle holders (a process row's
   * `canRelease`; the notebook section's model.notebookActions), and never while suspended.
   */
  onlyForHolders: boolean;
  /** Offered only where the kernel can be suspended (the server can, it is idle and holds GPU
   * memory), or only where it is suspended. */
  offer?: 'suspendable' | 'suspended';
}

/** What decides which rows of the table a kernel's buttons show. */
export interface IOfferContext {
  /** Whether "Release cache" applies (see `onlyForHolders`); null: not known, offered. */
  holder: boolean | null;
  suspendable: boolean;
  suspended: boolean;
}

/** Whether a row of the table is offered: a suspended kernel holds nothing on a GPU to release. */
export function offered(spec: IKernelActionSpec, ctx: IOfferContext): boolean {
  if (spec.offer === 'suspendable') {
    return ctx.suspendable && !ctx.suspended;
  }
  if (spec.offer === 'suspended') {
    return ctx.suspended;
  }
  if (spec.onlyForHolders && ctx.suspended) {
    return false;
  }
  return ctx.holder === null || !spec.onlyForHolders || ctx.holder;
}

/** In the order the buttons appear: the least harmful first. */
export const KERNEL_ACTIONS: readonly IKernelActionSpec[] = [
  {
    action: 'interrupt',
    verb: 'Interrupt',
    phrase: 'Interrupt the kernel of',
    title: 'Interrupt kernel?',
    warning: 'The running cell stops with KeyboardInterrupt.',
    api: 'interrupt',
    destructive: true,
    onlyForHolders: false
  },
  {
    action: 'release',
    verb: 'Release cache',
    phrase: 'Release the cached GPU memory of',
    title: 'Release cached memory?',
    warning: "Frees this notebook's cached GPU memory; its variables stay.",
    api: 'release',
    destructive: false,
    onlyForHolders: true
  },
  {
    action: 'suspend',
    verb: 'Suspend',
    phrase: 'Suspend the GPU of',
    title: 'Suspend the GPU of this notebook?',
    warning:
      "Moves this notebook's GPU memory into host memory; its variables stay, and it resumes on its next cell.",
    api: 'suspend',
    destructive: false,
    onlyForHolders: false,
    offer: 'suspendable'
  },
  {
    action: 'resume',
    verb: 'Resume',
    phrase: 'Resume the GPU of',
    title: 'Resume now?',
    warning: "Brings this notebook's GPU memory back now, rather than on its next cell.",
    api: 'resume',
    destructive: false,
    onlyForHolders: false,
    offer: 'suspended'
  },
  {
    action: 'restart',
    verb: 'Restart',
    phrase: 'Restart the kernel of',
    title: 'Restart kernel?',
    warning: 'All variables are lost and its GPU memory is released.',
    api: 'restart',
    destructive: true,
    onlyForHolders: false
  },
  {
    action: 'shutdown',
    verb: 'Shut down',
    phrase: 'Shut down the kernel of',
    title: 'Shut down kernel?',
    warning: 'All variables are lost and its GPU memory is released.',
    api: 'shutdown',
    destructive: true,
    onlyForHolders: false
  }
];

export function actionSpec(action: KernelAction): IKernelActionSpec {
  const spec = KERNEL_ACTIONS.find(a => a.action === action);
  if (!spec) {
    throw new Error(`unknown kernel action '${action}'`);
  }
  return spec;
}

/** The words of one action on one notebook's kernel, for a button and its confirmation. */
export interface IActionWording {
  /** The button's accessible name and tooltip: "Shut down the kernel of train.ipynb". */
  label: string;
  /** The dialog's title: "Shut down kernel?". */
  title: string;
  /** The dialog's question: "Shut down the kernel of train.ipynb? All variables are lost…". */
  body: string;
  /** The failure's title: "Could not shut down the kernel of train.ipynb". */
  failure: string;
}

export function actionWording(action: KernelAction, target: string): IActionWording {
  const { phrase, title, warning } = actionSpec(action);
  const label = `${phrase} ${target}`;
  return {
    label,
    title,
    body: `${label}? ${warning}`,
    failure: `Could not ${phrase[0].toLowerCase()}${phrase.slice(1)} ${target}`
  };
}
